"""Readers for CoNLL column files, CoNLL-U treebanks and XML field sequences (AnyStyle), and the
atomic file write every writer of the project uses.

A corpus is returned as a list of sentences; a sentence is a list of token rows and a token row
is a tuple of column strings. Every format problem raises :class:`DataFormatError`, whose message
names the file, the 1-based line number and the problem (a truncated or corrupt gzip file: the
line reached). A UTF-8 byte-order mark at the start of a file is ignored; a path that is a folder
raises :class:`IsADirectoryError`, a missing one :class:`FileNotFoundError`.
"""

from __future__ import annotations

import gzip
import os
import secrets
import stat
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO
from xml.parsers import expat

Sentence = list[tuple[str, ...]]

_GZIP_MAGIC = b"\x1f\x8b"
_BOM = "\ufeff"
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
_STREAM_ERRORS = (OSError, EOFError, zlib.error)  # truncated or corrupt gzip streams, read failures


class DataFormatError(ValueError):
    """A malformed input file; ``path``, ``line`` and ``problem`` say where and what.

    A ValueError; its message is ``"<path>:<line>: <problem>"``.

    Parameters
    ----------
    path : str or os.PathLike
        The file (kept as ``str``).
    line : int
        The 1-based line number of the problem.
    problem : str
        What is wrong, without the position.
    """

    def __init__(self, path: str | os.PathLike, line: int, problem: str) -> None:
        self.path = str(path)
        self.line = line
        self.problem = problem
        super().__init__(f"{self.path}:{line}: {problem}")

    def __reduce__(self) -> tuple:
        # pickled with its own arguments: a job's error crosses to the sweep's process (joblib), and an
        # error that cannot be unpickled there breaks the worker pool and stops the other jobs with it
        return type(self), (self.path, self.line, self.problem)


def special_file_kind(path: str | os.PathLike) -> str | None:
    """What ``path`` is when it exists but is neither a regular file nor a directory.

    Parameters
    ----------
    path : str or os.PathLike
        Any path (a symbolic link is followed).

    Returns
    -------
    str or None
        ``"a named pipe (FIFO)"``, ``"a socket"``, ``"a character device"`` or ``"a block
        device"``; None for anything else (a file, a folder, nothing).
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    kinds = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"))  # fmt: skip
    return next((name for test, name in kinds if test(mode)), None)


def check_input_file(path: str | os.PathLike, what: str = "", expected: str = "a data file") -> None:
    """Refuse a path that cannot be read as a data file, in one line.

    Parameters
    ----------
    path : str or os.PathLike
        The file to read.
    what : str, default=""
        Put before the path in the message (``"input "``).
    expected : str, default="a data file"
        What the path should be, for the message.

    Raises
    ------
    IsADirectoryError
        A folder.
    OSError
        A named pipe, socket or device.
    FileNotFoundError
        Nothing there (a dangling symbolic link is named as one).
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{what}{path}: is a directory, expected {expected}")
    if path.is_file():
        return
    kind = special_file_kind(path)
    if kind is not None:
        raise OSError(f"{what}{path}: is {kind}, not a regular file: expected {expected}")
    if path.is_symlink():
        raise FileNotFoundError(f"{what}{path}: a symbolic link to {os.readlink(path)}, which does not exist (no such file)")
    raise FileNotFoundError(f"{what}{path}: no such file")


def _opener(path: Path) -> Callable:
    """``gzip.open`` for a gzip file, else ``open``; the errors of :func:`check_input_file`."""
    check_input_file(path)
    with open(path, "rb") as probe:
        return gzip.open if probe.read(2) == _GZIP_MAGIC else open


def _unreadable(path: str | os.PathLike, line: int, error: BaseException, opener: Callable) -> DataFormatError:
    """The error for a read that failed after ``line`` complete lines (reported at the next line)."""
    what = "truncated or corrupt gzip stream, " if opener is gzip.open else ""
    return DataFormatError(
        path, line + 1, f"cannot read file: {what}{type(error).__name__}: {error} (after {line} complete lines)"
    )


def read_blocks(path: str | os.PathLike, size: int = 1 << 16) -> Iterator[bytes]:
    """Yield the file's bytes (decompressed when gzip, recognised by its magic bytes) in blocks.

    Parameters
    ----------
    path : str or os.PathLike
        A plain or gzip file.
    size : int, default=65536
        The most bytes per block.

    Yields
    ------
    bytes
        Blocks of up to ``size`` bytes, in order.

    Raises
    ------
    DataFormatError
        A truncated or corrupt gzip stream (or a failed read), naming the file and the line
        reached (lines completed in the blocks already yielded).
    FileNotFoundError, IsADirectoryError
        A missing path, or a folder.
    """
    opener = _opener(Path(path))
    lines = 0
    try:
        with opener(path, "rb") as handle:
            for block in iter(lambda: handle.read(size), b""):
                lines += block.count(b"\n")
                yield block
    except _STREAM_ERRORS as err:
        raise _unreadable(path, lines, err, opener) from None


def _read_bytes(path: str | os.PathLike) -> bytes:
    """The file's bytes, decompressed when gzip."""
    return b"".join(read_blocks(path))


def decoded_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """The lines of a UTF-8 text file, gzip-compressed or not, as the readers here see them.

    Parameters
    ----------
    path : str or os.PathLike
        The file; gzip (told by its first two bytes, whatever its name) is decompressed.

    Yields
    ------
    tuple of (int, str)
        The 1-based line number and the line without its line end (a UTF-8 byte-order mark at the
        start of the file dropped).

    Raises
    ------
    DataFormatError
        Naming the file and line: text that is not UTF-8 (UTF-16 named as such), a truncated or
        damaged gzip stream, an unreadable file.
    """
    path = Path(path)
    opener = _opener(path)
    number = 0
    try:
        with opener(path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    if number == 1 and raw.startswith(_UTF16_BOMS):
                        raise DataFormatError(path, 1, "the file is UTF-16 (byte-order mark); convert it to UTF-8") from None
                    raise DataFormatError(
                        path, number, f"not valid UTF-8 (byte {err.start}: {raw[err.start : err.start + 1]!r})"
                    ) from None
                if number == 1 and text.startswith(_BOM):
                    text = text[1:]
                yield number, text.rstrip("\r\n")
    except _STREAM_ERRORS as err:
        raise _unreadable(path, number, err, opener) from None


def _check_no_byte_order_mark(path, number: int, cells: tuple[str, ...]) -> None:
    """Refuse a cell that begins with U+FEFF past the file's start (files joined with their marks):
    no token may (:func:`crf.bundle.check_tokens`), so a model trained on it could not tag its data."""
    for column, cell in enumerate(cells, start=1):
        if cell.startswith(_BOM):
            raise DataFormatError(path, number, f"column {column} begins with U+FEFF (a byte-order mark, as where files "
                                  f"were joined) in {cell!r}: remove it")  # fmt: skip


def _check_no_whitespace(path, number: int, line: str, cells: tuple[str, ...]) -> None:
    """Refuse a cell (of a line cut at a separator such as a tab) that holds whitespace, U+00A0
    included: no token may (:func:`crf.bundle.check_tokens`: text is split into tokens at
    whitespace when tagged), so a model trained on it could not tag its data."""
    if "".join(cells) != "".join(line.split()):
        column, cell = next((i, c) for i, c in enumerate(cells, start=1) if any(ch.isspace() for ch in c))
        space = next(ch for ch in cell if ch.isspace())
        raise DataFormatError(path, number, f"column {column} holds whitespace (U+{ord(space):04X}) in {cell!r}: a token "
                              "holds none (text is split into tokens at whitespace when tagged); replace it")  # fmt: skip


def _cells(line: str, separator: str | None) -> tuple[str, ...]:
    """The cells of a token line; trailing empty cells (a final tab or separator) are dropped."""
    if separator is None:
        return tuple(line.split())
    cells = line.split(separator)
    while cells and cells[-1] == "":
        cells.pop()
    return tuple(cells)


def _sentences(
    path: str | os.PathLike,
    parse: Callable[[int, str], tuple[str, ...] | None],
    what: str,
    boundary: Callable[[], None] = lambda: None,
    token_lines: list[int] | None = None,
) -> list[Sentence]:
    """Group a file's token lines into sentences: blank lines end sentences (and call
    ``boundary()``), ``parse(number, line)`` turns a line into a token row (None: skip the line)
    or raises DataFormatError. ``token_lines``, when given, gets each token row's line number."""
    sentences: list[Sentence] = []
    current: Sentence = []
    saw_any_line = False
    for number, line in decoded_lines(path):
        saw_any_line = True
        if "\r" in line:  # whitespace to the cell split: lines that end in CR alone would read as one
            raise DataFormatError(
                path, number, "a carriage return inside a line: the file's lines end in CR alone; convert them to LF"
            )
        if not line.strip():
            if current:
                sentences.append(current)
                current = []
            boundary()
            continue
        row = parse(number, line)
        if row is not None:
            current.append(row)
            if token_lines is not None:
                token_lines.append(number)
    if current:
        sentences.append(current)
    if not saw_any_line:
        raise DataFormatError(path, 1, "file is empty")
    if not sentences:
        raise DataFormatError(path, 1, f"file holds no {what} lines")
    return sentences


DOCSTART = "-DOCSTART-"  # CoNLL-2003's document boundary line (``-DOCSTART- -X- -X- O``)


def read_conll(
    path: str | os.PathLike,
    n_columns: int | None = None,
    separator: str | None = None,
    comment_prefix: str | None = None,
    document_marker: str | None = DOCSTART,
    token_lines: list[int] | None = None,
) -> list[Sentence]:
    """Read a CoNLL column file: one token per line, columns split by ``separator``.

    ``separator=None`` splits on any run of whitespace; pass ``"\\t"`` for strictly tab-separated
    files whose cells may contain spaces. Blank lines end sentences. Every token line must have
    ``n_columns`` columns (by default, as many as the first token line); empty cells at the end of
    a line (a final separator) do not count.

    Lines that look like directives are explicit choices, never guesses:

    - ``document_marker`` (default ``-DOCSTART-``): a line whose first cell is exactly this is a
      document boundary (CoNLL-2003) and skipped. ``None``: no line is special; a word spelled
      ``-DOCSTART-`` is a token like any other.
    - ``comment_prefix`` (default ``None``: no comments): a line starting with it *before the first
      token line of a sentence* is a comment (sentence headers such as ``# sent_id = 1``, as some
      NER corpora's TSV files have) and skipped. Inside a sentence such a line is a token line, so
      a word ``#`` keeps its place. Without a prefix every non-blank line is a token line.

    Parameters
    ----------
    path : str or os.PathLike
        A UTF-8 text file, plain or gzip (a byte-order mark at the start is ignored).
    n_columns : int, optional
        The number of columns of every token line; None: as many as the first token line has.
    separator : str, optional
        The column separator; None (or ``""``): any run of whitespace.
    comment_prefix : str, optional
        Marks comment lines before a sentence's first token line (see above); None: no comments.
    document_marker : str or None, default="-DOCSTART-"
        The first cell of document boundary lines (see above); None: none.
    token_lines : list of int, optional
        When given, the 1-based line number of each token row is appended to it, in reading order
        (to name the line of a cell that a later check refuses).

    Returns
    -------
    list of sentences
        Each sentence a list of token rows, each row a tuple of ``n_columns`` non-empty strings.

    Raises
    ------
    DataFormatError
        Naming the file and the 1-based line: a line with another number of columns, an empty
        cell or no cell, a cell holding whitespace (with a ``separator``: a no-break space, say);
        an empty file; a file with no token lines; text that is not UTF-8 (a UTF-16 file is named
        as such); a truncated or corrupt gzip stream.
    FileNotFoundError, IsADirectoryError
        A missing path, or a folder.
    ValueError
        ``comment_prefix=""``.
    """
    if comment_prefix == "":
        raise ValueError("comment_prefix must be None or a non-empty string")
    expected = [n_columns]
    at_sentence_start = [True]

    def parse(number: int, line: str) -> tuple[str, ...] | None:
        if comment_prefix is not None and at_sentence_start[0] and line.startswith(comment_prefix):
            return None
        cells = _cells(line, separator or None)
        if not cells:
            raise DataFormatError(path, number, f"no columns in {line!r}")
        if document_marker is not None and cells[0] == document_marker:
            return None
        if expected[0] is None:
            expected[0] = len(cells)
        if len(cells) != expected[0]:
            raise DataFormatError(path, number, f"expected {expected[0]} columns, found {len(cells)}: {line!r}")
        if any(cell == "" for cell in cells):
            raise DataFormatError(path, number, f"empty column in {line!r}")
        if _BOM in line:
            _check_no_byte_order_mark(path, number, cells)
        if separator:
            _check_no_whitespace(path, number, line, cells)
        at_sentence_start[0] = False
        return cells

    def boundary() -> None:
        at_sentence_start[0] = True

    return _sentences(path, parse, "token", boundary, token_lines)


CONLLU_COLUMNS = ("id", "form", "lemma", "upos", "xpos", "feats", "head", "deprel", "deps", "misc")


def read_conllu(path: str | os.PathLike, token_lines: list[int] | None = None) -> list[Sentence]:
    """Read the word lines of a CoNLL-U file as 10-column token rows.

    Comment lines (``#``), multiword-token lines (ID ``3-4``) and empty nodes (ID ``8.1``) are
    skipped. A word line must have exactly 10 tab-separated columns (empty cells after the last
    are ignored) and an integer ID. Blank lines end sentences.

    Parameters
    ----------
    path : str or os.PathLike
        A UTF-8 CoNLL-U file, plain or gzip.
    token_lines : list of int, optional
        When given, the 1-based line number of each word row is appended to it, in reading order.

    Returns
    -------
    list of sentences
        Each sentence a list of word rows, each a tuple of the 10 column strings in
        :data:`CONLLU_COLUMNS` order (``id``, ``form``, ``lemma``, ``upos``, ...).

    Raises
    ------
    DataFormatError
        Naming the file and the 1-based line: a line without 10 tab-separated columns, or a word
        ID that is not an integer; an empty file; a file with no word lines; text that is not
        UTF-8 (a UTF-16 file is named as such); a truncated or corrupt gzip stream.
    FileNotFoundError, IsADirectoryError
        A missing path, or a folder.
    """

    def parse(number: int, line: str) -> tuple[str, ...] | None:
        if line.startswith("#"):
            return None
        cells = _cells(line, "\t")
        if len(cells) != 10:
            raise DataFormatError(path, number, f"expected 10 tab-separated columns, found {len(cells)}")
        token_id = cells[0]
        if "-" in token_id or "." in token_id:
            return None
        if not token_id.isdigit():
            raise DataFormatError(path, number, f"word ID {token_id!r} is not an integer")
        if _BOM in line:
            _check_no_byte_order_mark(path, number, cells)
        _check_no_whitespace(path, number, line, cells)
        return cells

    return _sentences(path, parse, "word", token_lines=token_lines)


def read_xml_sequences(path: str | os.PathLike, root: str = "dataset", sequence: str = "sequence") -> list[Sentence]:
    """Read labelled field sequences (AnyStyle's parser data) as ``(word, label)`` token rows.

    The document is ``<dataset>`` holding one ``<sequence>`` per item (a reference string); each
    child of a sequence is one field, its tag the field name and its text the field's words.
    The text is split on whitespace; the first token of a field is labelled ``B-<field>``, the
    others ``I-<field>`` (IOB2). Plain or gzip. The XML is parsed with expat, with any document
    type declaration refused, so no entity (internal or external) is ever declared or expanded.

    Parameters
    ----------
    path : str or os.PathLike
        An XML file, plain or gzip (its encoding as the XML declaration says; UTF-8 by default).
    root : str, default="dataset"
        The name of the document element.
    sequence : str, default="sequence"
        The name of the elements that hold one item each.

    Returns
    -------
    list of sentences
        One per ``<sequence>``, in document order: a list of ``(word, label)`` tuples.

    Raises
    ------
    DataFormatError
        (file, line, problem) for malformed XML, a DTD, an unexpected element, text outside a
        field, an element nested in a field, an empty field, an empty sequence or a document with
        no sequence; a truncated or corrupt gzip stream.
    FileNotFoundError, IsADirectoryError
        A missing path, or a folder.
    """
    data = _read_bytes(path)
    parser = expat.ParserCreate(encoding=None)
    sentences: list[Sentence] = []
    current: Sentence = []
    field_text: list[str] = []
    depth = [0]  # 0: outside the root, 1: in the root, 2: in a sequence, 3: in a field

    def line() -> int:
        return parser.CurrentLineNumber

    def fail(problem: str) -> None:
        raise DataFormatError(path, line(), problem)

    def start(name: str, attributes: dict) -> None:
        level = depth[0]
        if level == 0 and name != root:
            fail(f"the document element is <{name}>, expected <{root}>")
        if level == 1 and name != sequence:
            fail(f"<{name}> inside <{root}>, expected <{sequence}>")
        if level == 3:
            fail(f"element <{name}> nested inside a field")
        if level == 2:
            field_text.clear()
        depth[0] = level + 1

    def end(name: str) -> None:
        depth[0] -= 1
        level = depth[0]
        if level == 2:
            words = "".join(field_text).split()
            if not words:
                fail(f"field <{name}> holds no tokens")
            current.extend([(words[0], f"B-{name}")] + [(w, f"I-{name}") for w in words[1:]])
        elif level == 1:
            if not current:
                fail(f"empty <{sequence}> (no fields)")
            sentences.append(list(current))
            current.clear()
        elif level == 0 and not sentences:
            fail(f"<{root}> holds no <{sequence}> elements")

    def text(data: str) -> None:
        if depth[0] == 3:
            field_text.append(data)
        elif data.strip():
            where = f"inside <{sequence}> but outside any field" if depth[0] == 2 else f"outside any <{sequence}>"
            fail(f"text {data.strip()[:40]!r} {where}")

    def doctype(name: str, *_args) -> None:
        fail(f"document type declaration <!DOCTYPE {name}> refused (no DTDs or entities)")

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = text
    parser.StartDoctypeDeclHandler = doctype
    parser.EntityDeclHandler = lambda name, *_args: fail(f"entity declaration {name!r} refused")
    try:
        parser.Parse(data, True)
    except expat.ExpatError as err:
        raise DataFormatError(
            path, err.lineno, f"malformed XML: {expat.ErrorString(err.code)} (column {err.offset + 1})"
        ) from None
    return sentences


def column(sentences: list[Sentence], index: int) -> list[list[str]]:
    """Pick one column from every token: ``[[row[index] for row in s] for s in sentences]``.

    Parameters
    ----------
    sentences : list of sentences
        As the readers return them: lists of token rows (tuples of column strings).
    index : int
        The column (0-based; negative counts from the end, as in Python).

    Returns
    -------
    list of lists of str
        The column's value of every token, sentence by sentence.

    Raises
    ------
    IndexError
        A row with no column ``index``.
    """
    return [[row[index] for row in sentence] for sentence in sentences]


# --- writing ---


def writable_target(path: str | os.PathLike) -> Path:
    """The file that :func:`atomic_write` to ``path`` replaces (a symbolic link's target), checked
    before any work: the errors :func:`atomic_write` raises for a dangling link (or a loop), a
    folder, or what is not a regular file."""
    path = Path(path)
    if path.is_symlink():
        if not path.exists():
            raise FileNotFoundError(f"{path}: a symbolic link to {os.readlink(path)}, which does not exist; not written")
        path = Path(os.path.realpath(path))
    if path.is_dir():
        raise IsADirectoryError(f"{path}: a folder; not written")
    if path.exists() and not path.is_file():  # the rename would replace a device (/dev/null) or a pipe
        raise OSError(f"{path}: not a regular file (a device or a pipe), which the rename would replace; not written")
    return path


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> None:
    """Call ``write(handle)`` on a temporary file beside ``path``, flush it to disk and rename it
    into place: readers see the old file or the complete new one, never a partial write.

    The file gets the permissions an ordinary ``open(path, "w")`` would give it: a new file
    ``0o666`` less the umask (applied by the system when the temporary file is created, so default
    ACLs apply too); a file that replaces an existing one keeps that file's permission bits
    (``0o777`` of them: set-user/group-ID and sticky bits are not carried over). Unlike an
    ordinary write, the replaced file's owner, group and hard links are not kept: the new file
    belongs to the writer.

    A symbolic link is written through, as an ordinary write would: its target is replaced and
    the link stays. A dangling link (its target missing) is refused (FileNotFoundError): the
    rename would replace the link by a file, and writing its target could create a file anywhere.

    Parameters
    ----------
    path : str or os.PathLike
        The file to write; missing parent folders are created.
    write : callable
        Called once with a binary file handle open for writing; what it writes becomes the file.
        If it raises, the temporary file is removed and ``path`` is left as it was.

    Raises
    ------
    FileNotFoundError
        ``path`` is a dangling symbolic link.
    IsADirectoryError
        ``path`` is a folder.
    OSError
        ``path`` exists but is not a regular file (a device such as ``/dev/null``, a pipe: the
        rename would replace it), or the file system refused a step (nothing partial is left at
        ``path``).
    """
    path = writable_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = _create_temporary(path)
    try:
        with os.fdopen(handle, "wb") as out:
            try:
                os.fchmod(out.fileno(), os.stat(path).st_mode & 0o777)
            except FileNotFoundError:
                pass  # a new file: the mode it was created with
            write(out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def _create_temporary(path: Path) -> tuple[int, str]:
    """(descriptor, name) of a new hidden file beside ``path``, created exclusively with mode
    ``0o666`` less the umask (``tempfile.mkstemp`` would create it ``0o600``). The name is kept
    within the 255 bytes a file name may have, however long ``path``'s own name is."""
    stem = os.fsdecode(os.fsencode(path.name)[: 255 - len(".." + "0" * 12 + ".tmp")])  # . stem . 12 hex digits .tmp
    for _ in range(100):
        name = str(path.parent / f".{stem}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666), name
        except FileExistsError:
            continue
    raise FileExistsError(f"{path.parent}: no free temporary file name for {path.name}")
