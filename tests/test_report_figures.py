"""Figures on disk = figures in the report: the page embeds the very files it writes under
``figures/<preset>/`` (rpka.report.Figures), and the committed full report's images are the
committed files of ``figures/full/``, byte for byte."""

import base64
import hashlib
import re
from html.parser import HTMLParser

import matplotlib.pyplot as plt
import pytest

from rpka import paths, report
from rpka.io import save_figure

ROOT = paths.REPO_ROOT
EMBEDDED = re.compile(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _embedded(page: str) -> list[bytes]:
    return [base64.b64decode(b) for b in EMBEDDED.findall(page)]


def test_every_figure_shown_is_a_file_and_the_page_embeds_its_bytes(tmp_path):
    figs = report.Figures(figures_dir=tmp_path)
    unsaved, ax = plt.subplots()
    ax.plot([1, 2])
    saved, ax2 = plt.subplots()
    ax2.plot([3, 1])
    save_figure(saved, tmp_path / "own", "by_its_function")
    ax2.set_title("changed after its function saved it")  # stale: written again
    pages = [
        figs.show(unsaved, "caption", "alt", name="named").data,
        figs.show(saved, "caption", "alt").data,
    ]
    assert figs.files == {1: tmp_path / "named.png", 2: tmp_path / "own" / "by_its_function.png"}
    for number, page in zip(figs.files, pages, strict=True):
        (png,) = _embedded(page)
        assert png == figs.files[number].read_bytes()
    unnamed, _ = plt.subplots()
    figs.show(unnamed, "caption", "alt")
    assert figs.files[3] == tmp_path / "report_figure_3.png"


def test_the_committed_report_embeds_the_committed_figures_byte_for_byte():
    page = (ROOT / "docs" / "rpka_report_full.html").read_text()
    on_disk = {_sha(p.read_bytes()): p.name for p in (ROOT / "figures" / "full").glob("*.png")}
    images = _embedded(page)
    assert images
    stale = [i + 1 for i, png in enumerate(images) if _sha(png) not in on_disk]
    assert not stale, (
        f"figures {stale} of docs/rpka_report_full.html are not the files of figures/full/: "
        "render the report (`python -m rpka report --from-results`), copy it to docs/ and "
        "commit the figures it wrote"
    )


def test_every_figure_the_readme_shows_is_committed():
    readme = (ROOT / "README.md").read_text()
    shown = re.findall(r"\]\((figures/[^)]+\.png)\)", readme)
    assert shown
    assert [p for p in shown if not (ROOT / p).exists()] == []


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.names: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.names.add(tag)


# every element the rendered page may hold (nbconvert's page, Markdown, pandas' tables)
HTML_TAGS = set(
    "html head meta title style body main div span p a b i em strong code pre ul ol li "
    "table thead tbody tfoot tr th td caption colgroup col h1 h2 h3 h4 h5 h6 br hr img "
    "figure figcaption blockquote footer header section nav sup sub del ins svg path g "
    "defs use link label input details summary small".split()
)


@pytest.mark.parametrize("preset", ["full", "standard"])
def test_the_committed_report_has_no_unescaped_generated_text(preset):
    """A generated string with ``<name>`` in it (``arms.<arm>.sweep``) parses as an
    element nobody wrote: every element of the page must be an HTML one."""
    page = ROOT / "docs" / f"rpka_report_{preset}.html"
    if not page.exists():
        pytest.skip(f"no committed {page.name}")
    parser = _Tags()
    parser.feed(page.read_text())
    assert parser.names - HTML_TAGS == set()
