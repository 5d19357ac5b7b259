"""Dotted key paths of a JSON result, for the tests that check every key is documented."""

from collections.abc import Callable, Collection, Mapping


def key_paths(
    obj: object,
    opaque: Collection[str],
    placeholders: Mapping[str, str],
    normalise: Callable[[str], str] = lambda path: path,
    prefix: str = "",
) -> set[str]:
    """Every dotted path in ``obj``: the keys of a dict at a path in ``placeholders`` become
    that placeholder (``arms`` -> ``<arm>``), list items ``[]`` (their first item stands for
    all), and nothing below a path in ``opaque`` (after ``normalise``) is listed."""
    paths: set[str] = set()
    if normalise(prefix) in opaque:
        return paths
    if isinstance(obj, dict):
        for key, value in obj.items():
            name = placeholders.get(prefix, key)
            path = f"{prefix}.{name}" if prefix else name
            paths.add(path)
            paths |= key_paths(value, opaque, placeholders, normalise, path)
    elif isinstance(obj, list) and obj and isinstance(obj[0], dict):
        paths |= key_paths(obj[0], opaque, placeholders, normalise, f"{prefix}[]")
    return paths
