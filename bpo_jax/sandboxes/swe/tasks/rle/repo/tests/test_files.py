from rle import compress_text, decompress_text


def test_round_trip_short():
    text = "aab\nxyz"
    assert decompress_text(compress_text(text)) == text
