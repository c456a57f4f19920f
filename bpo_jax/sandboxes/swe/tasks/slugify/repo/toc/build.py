"""Markdown tables of contents."""
from toc.slug import unique_slugs


def headings(markdown):
    out = []
    for line in markdown.splitlines():
        stripped = line.lstrip()
        if stripped.startswith("#"):
            level = len(stripped) - len(stripped.lstrip("#"))
            out.append((level, stripped[level:].strip()))
    return out


def table_of_contents(markdown):
    found = headings(markdown)
    slugs = unique_slugs([title for _, title in found])
    return "\n".join(f"{'  ' * (level - 1)}- [{title}](#{slug})"
                     for (level, title), slug in zip(found, slugs))
