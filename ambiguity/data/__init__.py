"""Data sets the toolkit reads: Fashion-MNIST (IDX files), captions (text or MS-COCO JSON)."""
