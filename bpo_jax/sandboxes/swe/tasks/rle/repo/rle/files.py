"""Line-wise compression of text."""
from rle.codec import decode, encode


def compress_text(text):
    return "\n".join(encode(line) for line in text.split("\n"))


def decompress_text(code):
    return "\n".join(decode(line) for line in code.split("\n"))
