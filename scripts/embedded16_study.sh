#!/usr/bin/env bash
# Issue 23: the embedded-16 study, from the retrained GPT to the paper on it, one step at a time.
#
#   bash scripts/embedded16_study.sh STEP...     # steps in the order below; each resumes or skips when done
#   bash scripts/embedded16_study.sh all         # every step (many CPU-hours on 2 cores; see README);
#                                                # `all` stands alone: not combined with other steps
#   bash scripts/embedded16_study.sh --help      # this text (also -h, help)
#
# Steps:
#   train       the GPT towards convergence (warm restart from the shipped weights, 4 test
#               evaluations per epoch, stop < 0.02 bits/token per epoch after >= 1.9 epochs); resumes
#   snapshot    the run's latest model -> $RUN/snapshot.safetensors (end of a session; continue with
#               OLD_RUN=$RUN INIT=$RUN/snapshot.safetensors INIT_EPOCHS= RUN=<new dir> ... train).
#               Snapshots and the shipped 3.98-epoch weights record their epochs: leave INIT_EPOCHS empty
#               (set it only for a file that does not, e.g. the first release's 0.48-epoch GPT: 0.48).
#   ship        the stopped run's weights and metrics -> ambiguity/weights/. Refuses a run dir that does
#               not exist, a run still going (no gpt_done.json), and a run that stopped on its step budget
#               rather than the stop rule (it prints the stop reason and epochs first; FORCE=1 ships it)
#   figures     training curve and samples -> figures/embedded16_{training_curve,samples}.png
#   drafter     EAGLE-style drafter: self-generated sequences + data tokens, until test top-1 stops rising
#   compare     ambiguity next to embedded and text-twin (lantern.drafter.comparison, 256 images)
#   sweep       decoding sweep: SD tuned (chains, EAGLE-2 tree), LANTERN chain/static/dynamic at the paper's k, δ
#   distortion  the exact per-step TVD(output, p) over the paper's k and δ, for drafts sampled from q and for an
#               EAGLE-2 tree node's top-10 children, and its drivers (H(p), H(q), top-1), 32 AR images; then
#               where the moved mass lands (excess target NLL, out-of-support mass: probe_emitted_tokens.py)
#   quality     the k = 1000 quality grid with lantern.generate, batched ($GEN_BATCH images a forward):
#               AR, EAGLE-2 and LANTERN over δ 0.05-0.4 on the EAGLE-2 tree, $GRID_IMAGES images each (same
#               seeds and classes, so paired), then session_scores.py (target NLL, class consistency,
#               classifier accuracy vs AR) and lantern.evaluate (FID / KID / precision / recall, fmnist and
#               MobileNet, paired with AR) -> runs/embedded16-quality$GRID_IMAGES/. On a GPU 500 images a
#               method take under a minute (H200); on 2 CPU cores many hours
#   grid        the quality grid alone: AR, EAGLE-2 and LANTERN at k = 1000 over δ 0.05-0.4 (+ Table 3's
#               ablations) on the EAGLE-2 tree, $GRID_IMAGES images per method, fmnist FID / KID / precision /
#               recall, then each method's target NLL, class consistency and classifier accuracy paired with AR;
#               figure -> figures/embedded16_quality_grid.png. A larger GRID_IMAGES starts from the rounds
#               of an earlier grid run (its session is copied), so a grid grows in steps
#   paper       python -m lantern.paper --models embedded-16,text-twin at $PAPER_IMAGES images per quality cell
#
# Environment: RUN (training run dir, default runs/embedded-16-long), THREADS (default 2),
# EPOCHS (this run's most epochs, default 1.5), INIT / INIT_EPOCHS (warm start), PAPER_IMAGES (default 500),
# GRID_IMAGES (default 128), GEN_BATCH (quality: images decoded together, default 50),
# OLD_RUN (train: copy its token caches tokens_*.pt into a new RUN first, skipping the tokenizing; they
# are reused only if they were made with the same VQ file), FORCE=1 (ship: accept a step-budget stop),
# LR (train: this run's peak learning rate, e.g. 3e-4 for a restart from a decayed run), CURVE_RUNS (figures: the earlier run dirs of a warm-restart chain, space-separated, in training order),
# CURVE_EARLIER (figures: the CSV of an earlier joined curve whose run dirs are gone, e.g.
# figures/embedded16_training_curve.csv; its runs come first).
set -euo pipefail
cd "$(dirname "$0")/.."

RUN=${RUN:-runs/embedded-16-long}
THREADS=${THREADS:-2}
EPOCHS=${EPOCHS:-1.5}
INIT=${INIT:-ambiguity/weights/fashion16_gpt.safetensors}
INIT_EPOCHS=${INIT_EPOCHS:-}
PAPER_IMAGES=${PAPER_IMAGES:-500}
GRID_IMAGES=${GRID_IMAGES:-128}
GEN_BATCH=${GEN_BATCH:-50}
OLD_RUN=${OLD_RUN:-}
FORCE=${FORCE:-}
PY=${PYTHON:-python}

die() {
    echo "error: $*" >&2
    exit 2
}

step_train() {
    if [ -n "$OLD_RUN" ]; then
        mkdir -p "$RUN"
        for f in tokens_train.pt tokens_test.pt; do
            if [ -f "$OLD_RUN/$f" ] && [ ! -f "$RUN/$f" ]; then
                cp "$OLD_RUN/$f" "$RUN/$f"
                echo "copied $OLD_RUN/$f to $RUN (no tokenizing)"
            fi
        done
    fi
    local init=(--init-from "$INIT")
    [ -n "$INIT_EPOCHS" ] && init+=(--init-epochs "$INIT_EPOCHS")
    [ -n "${LR:-}" ] && init+=(--lr "$LR")
    $PY scripts/train_embedded.py --recipe embedded-16-long --stage gpt "${init[@]}" --epochs "$EPOCHS" \
        --threads "$THREADS" --run-dir "$RUN" --out "$RUN/weights" --no-progress
}

step_snapshot() {
    $PY scripts/train_embedded.py --recipe embedded-16-long --run-dir "$RUN" --snapshot "$RUN/snapshot.safetensors"
}

check_ship() {
    [ -n "${SHIP_CHECKED:-}" ] && return 0
    [ -d "$RUN" ] || die "RUN=$RUN does not exist; set RUN to the training run dir"
    [ -f "$RUN/gpt_done.json" ] || die "$RUN has not stopped yet (no gpt_done.json); run the train step to its end"
    local info
    info=$($PY -c "import json, sys; m = json.load(open(sys.argv[1]))['metrics']; print(f\"{m['epochs']:.2f} epochs; stop: {m.get('stop_reason')}\")" "$RUN/gpt_done.json")
    echo "$RUN: $info"
    if [[ "$info" == *"step budget reached"* ]] && [ "$FORCE" != 1 ]; then
        die "$RUN stopped on its step budget, not the stop rule (not converged); train on, or FORCE=1 to ship it"
    fi
    SHIP_CHECKED=1
}

step_ship() {
    check_ship
    cp "$RUN/weights/fashion16_gpt.safetensors" ambiguity/weights/
    # a GPT-only run's metrics have no "vq" section: keep the shipped VQ's, and the shipped GPT's under
    # "gpt_before" (the earlier GPT's test NLL and budget, for comparison)
    $PY - "$RUN/weights/embedded16_metrics.json" ambiguity/weights/embedded16_metrics.json <<'PYEOF'
import json, os, sys
new, old_path = json.load(open(sys.argv[1])), sys.argv[2]
old = json.load(open(old_path)) if os.path.exists(old_path) else {}
if "vq" not in new and "vq" in old:
    new["vq"] = old["vq"]
if "gpt" in old and old["gpt"].get("epochs") != new.get("gpt", {}).get("epochs"):
    new["gpt_before"] = {k: old["gpt"][k] for k in ("epochs", "token_budget", "test") if k in old["gpt"]}
tmp = old_path + ".tmp"
with open(tmp, "w") as f:
    json.dump(new, f, indent=2)
os.replace(tmp, old_path)
PYEOF
    echo "shipped $RUN/weights/fashion16_gpt.safetensors and its metrics (VQ metrics kept) to ambiguity/weights/"
}

step_figures() {
    local runs=()
    for d in ${CURVE_RUNS:-}; do runs+=(--run-dir "$d"); done # earlier runs of a warm-restart chain, in order
    [ -n "${CURVE_EARLIER:-}" ] && runs=(--earlier "$CURVE_EARLIER" "${runs[@]}") # an earlier joined curve's CSV
    $PY scripts/figure_training_curve.py "${runs[@]}" --run-dir "$RUN"
    $PY scripts/figure_embedded_samples.py --model embedded-16
}

step_drafter() {
    # the paper's sampling (CFG 3, top-k 2000) for the self-generated half; 10k data sequences beside them
    # (all 60k would cost ~5x per epoch on 2 cores). The shipped drafter: this command on an H200 (3.5 min;
    # features in float32 as on the CPU), stopped by patience after epoch 22 of the 40-epoch schedule
    $PY -m lantern.drafter.train --model embedded-16 --self-generate 10000 --cfg 3 --top-k 2000 --gen-batch-size 64 \
        --with-data --train-size 10000 --epochs 40 --patience 2 --dtype float32 \
        --out lantern/weights/embedded-16_drafter.safetensors --figure figures/embedded16_drafter_accuracy.png \
        --no-progress
}

step_compare() {
    $PY -m lantern.drafter.comparison --models embedded,embedded-16,text-twin --num-images 256 --batch-size 32 --no-progress
}

step_sweep() {
    $PY benchmarks/bench_decoding.py --model embedded-16 --ks 100,300,1000 --deltas 0.05,0.1,0.2,0.4 \
        --temperatures 1 --num-images 32 --batch-size 8 --timing-images 4 --repeats 3 --sd-gammas 2,4 \
        --sd-tree-sizes 59 --threads "$THREADS" --out "$RUN/sweep" --figure figures/embedded16_lantern_sweep
}

step_distortion() {
    $PY -m lantern.paper --models embedded-16,text-twin --only distortion --name embedded16-distortion --no-progress
    $PY benchmarks/probe_emitted_tokens.py --model embedded-16 --num-images 4 \
        --out runs/paper/embedded16-distortion/emitted_tokens.csv
}

step_quality() {
    local out="runs/embedded16-quality$GRID_IMAGES" d runs=()
    local common=(--model embedded-16 --num-images "$GRID_IMAGES" --batch-size "$GEN_BATCH" --cfg 3 --top-k 2000
        --temperature 1 --dtype float32 --no-progress)
    $PY -m lantern.generate "${common[@]}" --method ar --out "$out/ar"
    $PY -m lantern.generate "${common[@]}" --method sd --tree dynamic --out "$out/eagle2"
    runs=("$out/ar" "$out/eagle2")
    for d in 0.05 0.1 0.2 0.4; do
        runs+=("$out/lantern-k1000-d$d")
        $PY -m lantern.generate "${common[@]}" --method lantern --tree dynamic --k 1000 --delta "$d" --out "${runs[-1]}"
    done
    $PY scripts/session_scores.py "$out" --model embedded-16
    $PY -m lantern.evaluate "${runs[@]}" --extractors fmnist,mobilenet --paired-with "$out/ar" --out "$out/evaluate" \
        --no-progress
}

step_grid() {
    local out="runs/paper/embedded16-grid$GRID_IMAGES" prev=""
    if [ ! -d "$out/sessions/embedded-16-T1" ]; then # a smaller grid's decoded rounds are this one's first rounds
        local d n most=0
        for d in runs/paper/embedded16-grid*/sessions/embedded-16-T1; do # the one with the most rounds
            [ -d "$d" ] || continue
            n=$(find "$d/parts" -name 'round_*.json' 2>/dev/null | wc -l)
            if [ "$n" -gt "$most" ]; then most=$n prev=$d; fi
        done
        if [ -n "$prev" ]; then
            mkdir -p "$out/sessions" && cp -r "$prev" "$out/sessions/"
            echo "reusing the rounds decoded in $prev"
        fi
    fi
    $PY -m lantern.paper --models embedded-16 --only fig5 --ks 1000 --deltas 0.05,0.1,0.2,0.4 --jsd-deltas 0.1 \
        --main-images "$GRID_IMAGES" --grid-images "$GRID_IMAGES" --timing-images 2 --extractors fmnist \
        --out "$out" --no-progress
    $PY scripts/session_scores.py "$out/sessions/embedded-16-T1" --model embedded-16
    $PY scripts/figure_quality_grid.py "$out" --model embedded-16 # figures/embedded16_quality_grid
}

step_paper() {
    $PY -m lantern.paper --models embedded-16,text-twin --main-images "$PAPER_IMAGES" \
        --grid-images "$PAPER_IMAGES" --compile --name "embedded16-$PAPER_IMAGES" --no-progress
    $PY scripts/session_scores.py "runs/paper/embedded16-$PAPER_IMAGES/sessions/embedded-16-T1" --model embedded-16
}

ALL=(train ship figures drafter compare sweep distortion quality grid paper)
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

# the whole dispatch is one function, read before it runs: editing this file while a long step runs
# (bash reads scripts as it goes) cannot change what the running script does next
main() {
    [ $# -eq 0 ] && { usage; exit 2; }
    case "$1" in -h | --help | help) usage; exit 0 ;; esac
    if [ "$1" = all ]; then
        [ $# -eq 1 ] || die "all runs every step; pass it alone or name steps (${ALL[*]} snapshot)"
        set -- "${ALL[@]}"
    fi
    for s in "$@"; do
        [ "$s" = all ] && die "all runs every step; pass it alone or name steps (${ALL[*]} snapshot)"
        declare -F "step_$s" >/dev/null || die "unknown step '$s'; choose from: ${ALL[*]} snapshot, or all alone"
    done
    case " $* " in *" train "*) ;; *" ship "*) check_ship ;; esac # before any step runs, unless train comes first
    if [ -n "$OLD_RUN" ] && [ ! -d "$OLD_RUN" ]; then
        case " $* " in *" train "*) die "OLD_RUN=$OLD_RUN does not exist; set it to the earlier run dir or leave it empty" ;; esac
    fi
    for s in "$@"; do
        echo "== $s ($(date -u +%H:%M:%S) UTC)"
        "step_$s"
    done
}

main "$@"
exit
