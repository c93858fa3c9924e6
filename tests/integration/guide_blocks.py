"""The runnable command blocks of a guide: a fenced ```sh block right after a
`<!-- runnable: WHERE -->` comment. WHERE names the hosts the block runs on
(hostA hostB ...), `install` (once, in the fresh root the hosts are made of) and
`background` (each command line is a long-running process, started and left running)."""

import re

BLOCK = re.compile(r"^<!-- runnable: ([^>]*?) -->\s*\n```sh\n(.*?)```", re.S | re.M)
MARK = re.compile(r"^<!-- runnable:", re.M)


class Block:
    def __init__(self, where, text, line):
        words = where.split()
        self.install = "install" in words
        self.background = "background" in words
        self.hosts = [w for w in words if w not in ("install", "background")]
        self.text = text
        self.line = line  # in the guide, for messages

    def commands(self):
        """The block's command lines (comments and blank lines left out)."""
        return [c for c in self.text.splitlines() if c.strip() and not c.lstrip().startswith("#")]

    def __repr__(self):
        return f"line {self.line} ({' '.join(self.hosts) or 'install'}): {self.commands()[0][:60]}..."


def runnable_blocks(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    blocks = []
    for m in BLOCK.finditer(text):
        b = Block(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1)
        if not b.install and not b.hosts:
            raise ValueError(f"{path}:{b.line}: a runnable block names no host and is no install block")
        blocks.append(b)
    marked = len(MARK.findall(text))
    if marked != len(blocks):
        raise ValueError(f"{path}: {marked} runnable marks but {len(blocks)} blocks after them (a mark must be "
                         "followed directly by a ```sh block)")
    return blocks
