"""Image folders (`<path>/<class>/<image>`) as a streaming source: the file list is the only thing held in
memory; each image is read, decoded and resized inside tf.data (`tf.io.decode_image`, bilinear
`tf.image.resize`), in parallel, after the shuffle and before the batch (images differ in size, so decoding
is per image, then batching).

A raw record is the text "<class id><TAB><path below data.path>": the hash split works on it (so moving or
renaming the dataset's folder keeps every image in its split), and the scan reads no pixel
(the classes are the folder names, or the declared `data.classes`). An image that does not decode stops the
run naming the file (`locate_undecodable`), or is skipped under `skip_corrupt`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tfship.core.errors import DatasetError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")


@dataclass(frozen=True)
class ImageFormat:
    """Records "<class id><TAB><path below `root`>"; decoded to float32 [height, width, channels] times `rescale`."""

    image_size: tuple[int, int]
    channels: int
    rescale: float
    input_name: str
    list_file: str
    class_names: tuple[str, ...]
    kind: str = "image_folder"
    compression: str = "none"
    feature_names: tuple[str, ...] = ()
    dtype = "float32"
    label = "class"
    per_record = True
    root: str = ""  # the image folder (data.path, resolved): record paths are below it

    @property
    def example_shape(self) -> tuple[int, ...]:
        return (*self.image_size, self.channels)

    def read(self, file):
        """The records of the listing file (one line per image)."""
        import tensorflow as tf

        return tf.data.TextLineDataset(file)

    def decode(self, record):
        """(image float32 [h, w, c], class name string []) of one record."""
        import tensorflow as tf

        parts = tf.strings.split(record, "\t", maxsplit=1)
        path = tf.strings.join([self.root, parts[1]], separator="/")
        image = tf.io.decode_image(tf.io.read_file(path), channels=self.channels, expand_animations=False)
        resized = tf.image.resize(tf.cast(image, tf.float32), self.image_size) * self.rescale
        label = tf.gather(tf.constant(list(self.class_names)), tf.strings.to_number(parts[0], tf.int32))
        return tf.ensure_shape(resized, self.example_shape), label

    def parse(self, batch):
        """(class names string [B], class names string [B]) of records [B]: no pixel (the scan's view)."""
        import tensorflow as tf

        parts = tf.strings.split(batch, "\t", maxsplit=1).to_tensor()
        label = tf.gather(tf.constant(list(self.class_names)), tf.strings.to_number(parts[:, 0], tf.int32))
        return label, label

    def where(self, index: int, offset: int | None) -> str:
        return f"image {index + 1} of the listing"


def image_file_sets(config, listing_dir: Path) -> tuple[dict[str, tuple[str, ...]], tuple[str, ...]]:
    """({"all": (listing file,)}, class names): the folder's images listed once into `listing_dir` (a text
    file, one "<class id><TAB><path below data.path>" line per image, sorted), so the source is one text file to stream.

    Raises:
        DatasetError: no folder, no image, a class folder outside the declared classes.
    """
    import hashlib

    root = Path(config.path) if config.path is not None else None
    if root is None or not root.is_dir():
        raise DatasetError(f"data.path: {root}: image folder not found")
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    names = tuple(config.classes) or tuple(p.name for p in folders)
    for folder in folders:
        if folder.name not in names:
            raise DatasetError(f"{folder}: class folder {folder.name!r} is not one of the declared classes "
                               f"{list(names)}")
    lines = []
    for class_id, name in enumerate(names):
        folder = root / name
        for file in sorted(folder.rglob("*")) if folder.is_dir() else []:
            if file.suffix.lower() in IMAGE_SUFFIXES and file.is_file():
                lines.append(f"{class_id}\t{file.relative_to(root).as_posix()}")
    if not lines:
        raise DatasetError(f"{root}: no images ({', '.join(IMAGE_SUFFIXES)}) in class subfolders {list(names)}")
    text = "\n".join(lines) + "\n"
    listing = Path(listing_dir) / f"images-{hashlib.sha256(text.encode()).hexdigest()[:16]}.txt"
    if not listing.is_file():
        listing.parent.mkdir(parents=True, exist_ok=True)
        partial = listing.with_suffix(".part")
        partial.write_text(text)
        partial.replace(listing)
    return {"all": (str(listing),)}, names


def image_format(config, class_names: tuple[str, ...], listing: str) -> ImageFormat:
    """The `ImageFormat` of a `DataSection` (image_size required)."""
    if config.image_size is None:
        raise DatasetError("data.image_size: required for data.source = 'image_folder' ([height, width])")
    return ImageFormat(tuple(config.image_size), 1 if config.color_mode == "grayscale" else 3, config.rescale,
                       config.input_name or "image", listing, class_names, root=str(Path(config.path).resolve()))


def locate_undecodable(split) -> str:
    """The first image of `split` that does not decode, named (read one by one: the error path only)."""
    import tensorflow as tf

    for record in split.format.read(split.files[0]):
        path = str(Path(split.format.root) / record.numpy().decode().split("\t", 1)[1])
        try:
            split.format.decode(record)
        except tf.errors.OpError as err:
            first = next((x for x in str(err.message).splitlines() if x.strip()), "")
            return f"{path}: cannot decode image: {first[:200]}"
    return "an image of the split (none fails when read alone)"
