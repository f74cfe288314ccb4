"""The Fashion-MNIST IDX reader on hand-written files (no data set needed)."""

import gzip

import numpy as np
import pytest
import torch

from ambiguity.data.fashion_mnist import CLASSES, find_dir, load_split, pad_to_32, read_idx, write_idx
from ambiguity.errors import UsageError

# 2 images of 2 x 3 pixels: magic 0x00000803, sizes 2, 2, 3 (big-endian uint32), 12 pixel bytes.
IMAGES_2x2x3 = bytes([0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 3, 0, 1, 2, 3, 4, 5, 255, 128, 64, 32, 16, 8])
LABELS_3 = bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 0, 9])


def test_read_hand_written_idx(tmp_path):
    (tmp_path / "img").write_bytes(IMAGES_2x2x3)
    arr = read_idx(tmp_path / "img")
    assert arr.dtype == np.uint8 and arr.shape == (2, 2, 3)
    assert arr[0].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert arr[1].tolist() == [[255, 128, 64], [32, 16, 8]]
    (tmp_path / "lab").write_bytes(LABELS_3)
    assert read_idx(tmp_path / "lab").tolist() == [7, 0, 9]


def test_read_gzipped_idx(tmp_path):
    with gzip.open(tmp_path / "lab.gz", "wb") as fh:
        fh.write(LABELS_3)
    assert read_idx(tmp_path / "lab.gz").tolist() == [7, 0, 9]


def test_write_idx_matches_hand_written_bytes(tmp_path):
    arr = np.array([[[0, 1, 2], [3, 4, 5]], [[255, 128, 64], [32, 16, 8]]], dtype=np.uint8)
    assert write_idx(tmp_path / "img", arr).read_bytes() == IMAGES_2x2x3
    write_idx(tmp_path / "lab.gz", np.array([7, 0, 9], dtype=np.uint8))
    assert gzip.open(tmp_path / "lab.gz").read() == LABELS_3
    with pytest.raises(ValueError):
        write_idx(tmp_path / "bad", np.zeros(3, dtype=np.int32))


def test_truncated_and_non_idx_files_are_usage_errors(tmp_path):
    (tmp_path / "short").write_bytes(IMAGES_2x2x3[:-1])
    with pytest.raises(UsageError, match="truncated"):
        read_idx(tmp_path / "short")
    (tmp_path / "text").write_bytes(b"hello world")
    with pytest.raises(UsageError, match="not an unsigned-byte IDX"):
        read_idx(tmp_path / "text")
    with pytest.raises(UsageError, match="does not exist"):
        read_idx(tmp_path / "absent")


def test_pad_to_32_scales_and_pads():
    img = torch.full((1, 28, 28), 51, dtype=torch.uint8)
    img[0, 0, 0] = 255
    out = pad_to_32(img)
    assert out.shape == (1, 1, 32, 32) and out.dtype == torch.float32
    assert out[0, 0, 2, 2].item() == 1.0
    assert out[0, 0, 2, 3].item() == pytest.approx(0.2)
    assert out[0, 0, :2].abs().sum() == 0 and out[0, 0, -2:].abs().sum() == 0
    assert out[0, 0, :, :2].abs().sum() == 0 and out[0, 0, :, -2:].abs().sum() == 0
    assert out.sum().item() == pytest.approx(1.0 + (28 * 28 - 1) * 0.2, rel=1e-5)


def _fake_split(d, prefix, n, gz):
    imgs = (np.arange(n * 28 * 28) % 256).astype(np.uint8).reshape(n, 28, 28)
    labels = (np.arange(n) % 10).astype(np.uint8)
    ext = ".gz" if gz else ""
    write_idx(d / f"{prefix}-images-idx3-ubyte{ext}", imgs)
    write_idx(d / f"{prefix}-labels-idx1-ubyte{ext}", labels)
    return imgs, labels


@pytest.mark.parametrize("gz", [False, True])
def test_load_split(tmp_path, gz):
    imgs, labels = _fake_split(tmp_path, "t10k", 3, gz)
    _fake_split(tmp_path, "train", 5, gz)
    x, y = load_split("test", tmp_path)
    assert x.shape == (3, 1, 32, 32) and y.dtype == torch.int64
    assert y.tolist() == [0, 1, 2]
    assert torch.equal(x[:, 0, 2:30, 2:30], torch.from_numpy(imgs).float() / 255)
    assert load_split("train", tmp_path)[0].shape == (5, 1, 32, 32)


def test_load_split_errors(tmp_path, monkeypatch):
    with pytest.raises(UsageError, match="split must be"):
        load_split("val", tmp_path)
    with pytest.raises(UsageError, match="--data DIR"):
        find_dir(tmp_path / "nowhere")
    _fake_split(tmp_path, "t10k", 3, False)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(2, dtype=np.uint8))
    with pytest.raises(UsageError, match="do not match"):
        load_split("test", tmp_path)
    with pytest.raises(UsageError, match="train files"):
        load_split("train", tmp_path)
    monkeypatch.setenv("FASHION_MNIST_DIR", str(tmp_path))
    assert find_dir() == tmp_path


def test_class_names():
    assert len(CLASSES) == 10 and CLASSES[0] == "T-shirt/top" and CLASSES[9] == "Ankle boot"
