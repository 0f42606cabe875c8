"""Line and column of every key, table and array item in a TOML document.

tomllib parses TOML but forgets where things were; `specs.loader` needs the
line of `[models.other]` and of the `ctxx =` under it to say where a problem
is. This scanner walks text that tomllib has already accepted (so it can be
lenient about malformed input) and records, for each path, the first place it
appears: table headers (`[models."qwen3:0.6b"]`, `[[x]]`), dotted keys
(`models.gemma.ctx = 1`), keys in inline tables and items of arrays.
"""

from __future__ import annotations

import bisect
import re
import tomllib

from specs.problems import Path

_BARE = re.compile(r"[A-Za-z0-9_-]+")
_SCALAR_END = re.compile(r"[,\]}\n#]")


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0
        self.starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.found: dict[Path, tuple[int, int]] = {}
        self.arrays: dict[Path, int] = {}  # array-of-tables path -> index of its last table

    def where(self, index: int) -> tuple[int, int]:
        line = bisect.bisect_right(self.starts, index)
        return line, index - self.starts[line - 1] + 1

    def record(self, path: Path, index: int) -> None:
        self.found.setdefault(path, self.where(index))

    def peek(self, n: int = 1) -> str:
        return self.text[self.i : self.i + n]

    def skip_blank(self, newlines: bool) -> None:
        chars = " \t\r\n" if newlines else " \t\r"
        while self.i < len(self.text):
            c = self.text[self.i]
            if c in chars:
                self.i += 1
            elif c == "#" and newlines:
                end = self.text.find("\n", self.i)
                self.i = len(self.text) if end < 0 else end
            else:
                return

    def run(self) -> dict[Path, tuple[int, int]]:
        table: Path = ()
        self.record((), 0)
        while True:
            self.skip_blank(newlines=True)
            if self.i >= len(self.text):
                return self.found
            start = self.i
            if self.peek(2) == "[[":
                self.i += 2
                keys = self.key(until="]")
                self.i += 2
                base = (*self.resolve(keys[:-1]), keys[-1])
                self.record(base, start)
                self.arrays[base] = self.arrays.get(base, -1) + 1
                table = (*base, self.arrays[base])
                self.record(table, start)
            elif self.peek() == "[":
                self.i += 1
                keys = self.key(until="]")
                self.i += 1
                table = self.resolve(keys)
                for end in range(1, len(table) + 1):
                    self.record(table[:end], start)
            else:
                self.keyval(table)

    def resolve(self, keys: list[str]) -> Path:
        """Header keys to a path, stepping into the last table of each array of tables."""
        path: Path = ()
        for key in keys:
            path = (*path, key)
            if path in self.arrays:
                path = (*path, self.arrays[path])
        return path

    def key(self, until: str) -> list[str]:
        parts: list[str] = []
        while True:
            self.skip_blank(newlines=False)
            c = self.peek()
            if c in ('"', "'"):
                start = self.i
                self.string()
                raw = self.text[start : self.i]
                parts.append(tomllib.loads(f"k = {raw}")["k"])
            else:
                match = _BARE.match(self.text, self.i)
                if match is None:  # not valid TOML; tomllib will have said so
                    raise ValueError("unexpected text in a key")
                parts.append(match.group())
                self.i = match.end()
            self.skip_blank(newlines=False)
            if self.peek() == ".":
                self.i += 1
                continue
            if self.peek() == until:
                return parts
            raise ValueError("unexpected text after a key")

    def keyval(self, base: Path) -> None:
        start = self.i
        keys = self.key(until="=")
        self.i += 1
        path = base
        for key in keys:
            path = (*path, key)
            self.record(path, start)
        self.skip_blank(newlines=False)
        self.value(path)

    def value(self, path: Path) -> None:
        c = self.peek()
        if c in ('"', "'"):
            self.string()
        elif c == "[":
            self.i += 1
            index = 0
            while True:
                self.skip_blank(newlines=True)
                if self.peek() == "]":
                    self.i += 1
                    return
                self.record((*path, index), self.i)
                self.value((*path, index))
                index += 1
                self.skip_blank(newlines=True)
                if self.peek() == ",":
                    self.i += 1
        elif c == "{":
            self.i += 1
            while True:
                self.skip_blank(newlines=False)
                if self.peek() == "}":
                    self.i += 1
                    return
                self.keyval(path)
                self.skip_blank(newlines=False)
                if self.peek() == ",":
                    self.i += 1
        else:
            match = _SCALAR_END.search(self.text, self.i)
            self.i = len(self.text) if match is None else match.start()

    def string(self) -> None:
        quote = self.peek()
        if self.peek(3) == quote * 3:
            end = self.i + 3
            while True:
                end = self.text.find(quote * 3, end)
                if end < 0:
                    raise ValueError("unterminated string")
                if quote == '"' and _escaped(self.text, end):
                    end += 1
                    continue
                end += 3
                while self.text[end : end + 1] == quote:  # up to two quotes may end the body
                    end += 1
                self.i = end
                return
        end = self.i + 1
        while True:
            end = self.text.find(quote, end)
            if end < 0:
                raise ValueError("unterminated string")
            if quote == '"' and _escaped(self.text, end):
                end += 1
                continue
            self.i = end + 1
            return


def _escaped(text: str, index: int) -> bool:
    """Whether the character at `index` follows an odd number of backslashes."""
    count = 0
    while index - count - 1 >= 0 and text[index - count - 1] == "\\":
        count += 1
    return count % 2 == 1


def toml_locations(text: str) -> dict[Path, tuple[int, int]]:
    """(line, column), both 1-based, of each path's first appearance in valid TOML text.

    Best effort: on text the scanner does not follow, what was found so far.
    """
    scanner = _Scanner(text)
    try:
        return scanner.run()
    except (ValueError, IndexError):
        return scanner.found
