"""Reading report.html back: a section by its anchor, a table's cells."""
import html
import re


def section_text(page: str, anchor: str) -> str:
    m = re.search(rf'<section id="{anchor}">(.*?)</section>', page, re.S)
    assert m, f"no section {anchor}"
    return m.group(1)


def table_rows(page: str, cls: str) -> list[list[tuple[str | None, str]]]:
    """Rows of the table with class `cls`: each cell (data-sort value or None, text)."""
    m = re.search(rf'<table class="sortable {re.escape(cls)}">(.*?)</table>', page, re.S)
    assert m, f"no table {cls}"
    body = m.group(1).split("<tbody>", 1)[1]
    rows = []
    for tr in re.findall(r"<tr>(.*?)</tr>", body, re.S):
        cells = re.findall(r"<td([^>]*)>(.*?)</td>", tr, re.S)
        rows.append([(re.search(r'data-sort="([^"]*)"', a).group(1) if "data-sort" in a else None, html.unescape(t))
                     for a, t in cells])
    return rows
