"""Run-length coding: "aaab" <-> "3a1b". Letters only (no digits in the text)."""


def encode(text):
    if any(c.isdigit() for c in text):
        raise ValueError("text must not contain digits")
    out, i = [], 0
    while i < len(text):
        j = i
        while j < len(text) and text[j] == text[i]:
            j += 1
        out.append(f"{j - i}{text[i]}")
        i = j
    return "".join(out)


def decode(code):
    out, i = [], 0
    while i < len(code):
        if not code[i].isdigit() or i + 1 >= len(code):
            raise ValueError(f"malformed code at position {i}: {code!r}")
        count, char = int(code[i]), code[i + 1]
        if char.isdigit():
            raise ValueError(f"malformed code at position {i}: {code!r}")
        out.append(char * count)
        i += 2
    return "".join(out)
