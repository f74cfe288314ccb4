"""ambiguity.data.captions: text files, MS-COCO JSON (longest caption per image), seeded subsets, errors."""

import json

import pytest

from ambiguity.data.captions import is_coco_json, load_captions, read_captions, sample_captions
from ambiguity.errors import UsageError

COCO = {
    "images": [{"id": 9}, {"id": 3}],
    "annotations": [
        {"image_id": 9, "id": 1, "caption": "A dog."},
        {"image_id": 3, "id": 2, "caption": "A red bus on a  street.\n"},
        {"image_id": 9, "id": 3, "caption": "A brown dog runs."},
        {"image_id": 3, "id": 4, "caption": "A bus."},
        {"image_id": 9, "id": 5, "caption": "A black dog eats."},  # same length as id 3: first one wins
    ],
}


def test_text_file_skips_blank_lines(tmp_path):
    f = tmp_path / "c.txt"
    f.write_text("  a cat on a mat \n\n\t\nA dog\r\nthird  caption\n")
    assert read_captions(f) == ["a cat on a mat", "A dog", "third caption"]


def test_coco_longest_caption_per_image_in_id_order(tmp_path):
    f = tmp_path / "captions_val2014.json"
    f.write_text(json.dumps(COCO))
    assert read_captions(f) == ["A red bus on a street.", "A brown dog runs."]


def test_coco_detected_by_content(tmp_path):
    f = tmp_path / "annotations.txt"
    f.write_text("  " + json.dumps(COCO))
    assert is_coco_json(f)
    assert read_captions(f) == ["A red bus on a street.", "A brown dog runs."]


def test_seeded_subset(tmp_path):
    caps = [f"caption {i}" for i in range(20)]
    a = sample_captions(caps, 5, seed=0)
    assert a == sample_captions(caps, 5, seed=0)
    assert len(a) == 5 and len(set(a)) == 5 and set(a) <= set(caps)
    assert a != sample_captions(caps, 5, seed=1)
    assert sorted(sample_captions(caps, None, seed=3)) == sorted(caps)
    f = tmp_path / "c.txt"
    f.write_text("\n".join(caps))
    assert load_captions(f, 5, seed=0) == a


@pytest.mark.parametrize("n", [0, 21])
def test_subset_size_errors(n):
    with pytest.raises(UsageError, match="--num-images"):
        sample_captions([f"c{i}" for i in range(20)], n, seed=0)


def _bad_files(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.txt").write_text("\n  \n\t\n")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    (tmp_path / "broken.json").write_text('{"annotations": [')
    (tmp_path / "nokey.json").write_text('{"images": []}')
    (tmp_path / "nocaption.json").write_text('{"annotations": [{"image_id": 1}]}')
    (tmp_path / "emptyann.json").write_text('{"annotations": []}')
    (tmp_path / "adir").mkdir()
    return [
        "missing.txt",
        "empty.txt",
        "blank.txt",
        "latin1.txt",
        "broken.json",
        "nokey.json",
        "nocaption.json",
        "emptyann.json",
        "adir",
    ]


def test_errors_are_one_line_and_name_the_fix(tmp_path):
    for name in _bad_files(tmp_path):
        with pytest.raises(UsageError) as e:
            read_captions(tmp_path / name)
        msg = str(e.value)
        assert "\n" not in msg, name
        assert "--captions" in msg, name
