"""The record's two descriptions, layout.py's docstring and docs/record-format.md, agree
with each other and with the constants the code writes (they drifted once: the docstring
still said version 2 and 16384 bytes after version 3 shipped)."""

from __future__ import annotations

import re
from pathlib import Path

from watchdog.record import layout

DOC = Path(__file__).resolve().parents[3] / "docs" / "record-format.md"


def _docstring_fields() -> dict[int, str]:
    """Offset -> struct of each header field (offsets below the slots) in the docstring."""
    fields: dict[int, str] = {}
    for line in (layout.__doc__ or "").splitlines():
        found = re.match(r"\s*(?:[a-z]+\s+)?(\d+)\s+(\d*[a-zA-Z])\s+\S", line)
        if found and int(found.group(1)) < 512:
            fields[int(found.group(1))] = found.group(2)
    return fields


def _doc_fields() -> dict[int, str]:
    """Offset -> struct of each header field in the docs' tables."""
    fields: dict[int, str] = {}
    for line in DOC.read_text().splitlines():
        found = re.match(r"\|\s*(\d+)\s*\|\s*\d+\s*\|\s*`([^`]+)`\s*\|", line)
        if found and int(found.group(1)) < 512:
            fields[int(found.group(1))] = found.group(2)
    return fields


def test_the_docstring_names_the_version_and_size_the_writer_writes() -> None:
    doc = layout.__doc__ or ""
    assert f"version ({layout.RECORD_VERSION})" in doc
    assert f"record size ({layout.RECORD_SIZE})" in doc
    assert f"Size: {layout.RECORD_SIZE} (v{layout.RECORD_VERSION})" in doc


def test_the_docs_name_the_version_and_size_the_writer_writes() -> None:
    text = DOC.read_text()
    assert f"version {layout.RECORD_VERSION}" in text.splitlines()[0]
    assert f"`{layout.RECORD_VERSION}` for this layout" in text
    assert f"record size, `{layout.RECORD_SIZE}`" in text


def test_the_docstring_and_the_docs_give_every_header_field_the_same_offset_and_struct() -> None:
    ours, theirs = _docstring_fields(), _doc_fields()
    assert len(ours) >= 20, ours  # the parse found the table
    shared = {offset for offset in ours if offset in theirs}
    assert len(shared) >= 20, (ours, theirs)
    assert {o: ours[o] for o in shared} == {o: theirs[o] for o in shared}
