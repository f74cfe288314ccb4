#!/usr/bin/env bash
# Issue 23: the embedded-16 study, from the retrained GPT to the paper on it, one step at a time.
#
#   bash scripts/embedded16_study.sh STEP...     # steps in the order below; each resumes or skips when done
#   bash scripts/embedded16_study.sh all         # every step (many CPU-hours on 2 cores; see README)
#
# Steps:
#   train       the GPT towards convergence (warm restart from the shipped 0.48-epoch weights, 4 test
#               evaluations per epoch, stop < 0.02 bits/token per epoch after >= 1.9 epochs); resumes
#   snapshot    the run's latest model -> $RUN/snapshot.safetensors (end of a session; continue with
#               INIT=$RUN/snapshot.safetensors INIT_EPOCHS= RUN=<new dir> ... train)
#   ship        the stopped run's weights and metrics -> ambiguity/weights/ (refuses a run still going)
#   figures     training curve and samples -> figures/embedded16_{training_curve,samples}.png
#   drafter     EAGLE-style drafter: self-generated sequences + data tokens, until test top-1 stops rising
#   compare     ambiguity next to embedded and text-twin (lantern.compare, 256 images)
#   sweep       decoding sweep: SD tuned (chains, EAGLE-2 tree), LANTERN chain/static/dynamic at the paper's k, δ
#   distortion  the exact per-step TVD(output, p) at the paper's k and δ
#   paper       python -m lantern.paper --models embedded-16,text-twin at $PAPER_IMAGES images per quality cell
#
# Environment: RUN (training run dir, default runs/embedded-16-long), THREADS (default 2),
# EPOCHS (this run's most epochs, default 1.5), INIT / INIT_EPOCHS (warm start), PAPER_IMAGES (default 500).
set -euo pipefail
cd "$(dirname "$0")/.."

RUN=${RUN:-runs/embedded-16-long}
THREADS=${THREADS:-2}
EPOCHS=${EPOCHS:-1.5}
INIT=${INIT:-ambiguity/weights/fashion16_gpt.safetensors}
INIT_EPOCHS=${INIT_EPOCHS-0.48}
PAPER_IMAGES=${PAPER_IMAGES:-500}
PY=${PYTHON:-python}

step_train() {
    local init=(--init-from "$INIT")
    [ -n "$INIT_EPOCHS" ] && init+=(--init-epochs "$INIT_EPOCHS")
    $PY scripts/train_embedded.py --recipe embedded-16-long --stage gpt "${init[@]}" --epochs "$EPOCHS" \
        --threads "$THREADS" --run-dir "$RUN" --out "$RUN/weights" --no-progress
}

step_snapshot() {
    $PY scripts/train_embedded.py --recipe embedded-16-long --run-dir "$RUN" --snapshot "$RUN/snapshot.safetensors"
}

step_ship() {
    if [ ! -f "$RUN/gpt_done.json" ]; then
        echo "embedded16_study: $RUN has not stopped yet (no gpt_done.json); run the train step to its end" >&2
        exit 2
    fi
    cp "$RUN/weights/fashion16_gpt.safetensors" "$RUN/weights/embedded16_metrics.json" ambiguity/weights/
    echo "shipped $RUN/weights/fashion16_gpt.safetensors and embedded16_metrics.json to ambiguity/weights/"
    $PY -c "import json, sys; m = json.load(open(sys.argv[1]))['metrics']; print(f\"{m['epochs']:.2f} epochs; stop: {m.get('stop_reason')}\")" "$RUN/gpt_done.json"
}

step_figures() {
    $PY scripts/figure_training_curve.py --run-dir "$RUN"
    $PY scripts/figure_embedded_samples.py --model embedded-16
}

step_drafter() {
    $PY -m lantern.train_drafter --model embedded-16 --self-generate 10000 --with-data --epochs 20 --patience 2 \
        --out lantern/weights/embedded-16_drafter.safetensors --figure figures/embedded16_drafter_accuracy.png \
        --no-progress
}

step_compare() {
    $PY -m lantern.compare --models embedded,embedded-16,text-twin --num-images 256 --batch-size 32 --no-progress
}

step_sweep() {
    $PY benchmarks/bench_decoding.py --model embedded-16 --ks 100,300,1000 --deltas 0.05,0.1,0.2,0.4 \
        --temperatures 1 --num-images 32 --batch-size 8 --timing-images 4 --repeats 3 --sd-gammas 2,4 \
        --sd-tree-sizes 59 --threads "$THREADS"
}

step_distortion() {
    $PY -m lantern.paper --models embedded-16,text-twin --only distortion --name embedded16-distortion --no-progress
}

step_paper() {
    $PY -m lantern.paper --models embedded-16,text-twin --main-images "$PAPER_IMAGES" \
        --grid-images "$PAPER_IMAGES" --name "embedded16-$PAPER_IMAGES" --no-progress
}

ALL=(train ship figures drafter compare sweep distortion paper)
[ $# -eq 0 ] && { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
[ "$1" = all ] && set -- "${ALL[@]}"
for s in "$@"; do
    if ! declare -F "step_$s" >/dev/null; then
        echo "embedded16_study: unknown step '$s'; choose from: ${ALL[*]} snapshot all" >&2
        exit 2
    fi
done
for s in "$@"; do
    echo "== $s ($(date -u +%H:%M:%S) UTC)"
    "step_$s"
done
