from rle.codec import decode, encode
from rle.files import compress_text, decompress_text
