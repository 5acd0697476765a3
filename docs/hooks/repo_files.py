"""MkDocs hook: files of the repository outside docs/ that the pages show, served under ``repo/``.

The committed example report's figures and the example grid files live where cocos writes and reads them
(``reports/example/``, ``examples/``); the site takes them from there instead of keeping copies that could drift.
A page links them as ``repo/<path in the repository>`` (``../repo/...`` from a page one folder down).
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

PATTERNS = ("reports/example/*/*.png", "examples/*.toml")


def on_files(files, config):
    root = Path(config.config_file_path).resolve().parent
    for pattern in PATTERNS:
        for path in sorted(root.glob(pattern)):
            files.append(File.generated(config, "repo/" + path.relative_to(root).as_posix(), abs_src_path=str(path)))
    return files
