"""Readers: CoNLL, CoNLL-U and XML field sequences, gzip, and a clear error for every malformed input."""

from __future__ import annotations

import gzip
import os

import pytest

from crf.io import DataFormatError, atomic_write, read_conll, read_conllu, read_xml_sequences


def test_reads_conll_columns_and_skips_docstart(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("-DOCSTART- -X- O\n\nHe PRP B-NP\nreckons VBZ B-VP\n\n\nThe DT B-NP\n", encoding="utf-8")
    sentences = read_conll(path)
    assert sentences == [[("He", "PRP", "B-NP"), ("reckons", "VBZ", "B-VP")], [("The", "DT", "B-NP")]]


def test_reads_gzip_and_tabs(tmp_path):
    path = tmp_path / "a.txt.gz"
    with gzip.open(path, "wt", encoding="utf-8") as out:
        out.write("York\tNNP\tB-LOC\nis\tVBZ\tO\n")
    assert read_conll(path, separator="\t") == [[("York", "NNP", "B-LOC"), ("is", "VBZ", "O")]]


def test_a_cell_that_begins_with_a_byte_order_mark_past_the_files_start_is_refused(tmp_path):
    """Files joined with their marks: the mark begins a later sentence's first word, which was trained
    on as a token that the model then refused to tag (its one token check). At the file's start it is dropped."""
    path = tmp_path / "joined.txt"
    path.write_text("\ufeffHe PRP B-NP\n\n\ufeffShe PRP B-NP\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"joined.txt:3: column 1 begins with U\+FEFF .* in '\\ufeffShe': remove it"):
        read_conll(path)
    path.write_text("\ufeffHe PRP B-NP\n", encoding="utf-8")
    assert read_conll(path) == [[("He", "PRP", "B-NP")]]
    conllu = tmp_path / "joined.conllu"
    conllu.write_bytes(CONLLU_WORD + b"\n\n" + CONLLU_WORD.replace(b"\tThe\t", b"\t\xef\xbb\xbfThe\t") + b"\n")
    with pytest.raises(DataFormatError, match=r"joined.conllu:3: column 2 begins with U\+FEFF"):
        read_conllu(conllu)


@pytest.mark.parametrize("cell", ["New York", "10\u00a0mg", "line\u2028sep", "end "])
def test_a_tab_separated_cell_holding_whitespace_is_refused_where_it_is_read(tmp_path, cell):
    """Trained on as one token, it could never be tagged: the tag command splits text at whitespace,
    and the served model and ``ModelBundle.tag`` refuse such a token (their one token check)."""
    path = tmp_path / "a.tsv"
    path.write_text(f"He\tB-X\n{cell}\tO\n", encoding="utf-8")
    space = next(ch for ch in cell if ch.isspace())
    with pytest.raises(DataFormatError, match=rf"a.tsv:2: column 1 holds whitespace \(U\+{ord(space):04X}\) in "):
        read_conll(path, separator="\t")
    conllu = tmp_path / "a.conllu"  # tab-separated too: its FORM column
    conllu.write_bytes(CONLLU_WORD + b"\n\n" + CONLLU_WORD.replace(b"\tThe\t", f"\t{cell}\t".encode()) + b"\n")
    with pytest.raises(DataFormatError, match=rf"a.conllu:3: column 2 holds whitespace \(U\+{ord(space):04X}\) in "):
        read_conllu(conllu)


@pytest.mark.parametrize(
    "content,line,problem",
    [
        ("a B\nb C D\n", 2, "expected 2 columns, found 3"),
        ("a B\n\nc\n", 3, "expected 2 columns, found 1"),
        ("", 1, "file is empty"),
        ("\n\n-DOCSTART- O\n", 1, "no token lines"),
    ],
)
def test_malformed_conll_names_file_line_and_problem(tmp_path, content, line, problem):
    path = tmp_path / "bad.txt"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataFormatError) as info:
        read_conll(path)
    assert info.value.line == line
    assert problem in str(info.value)
    assert str(path) in str(info.value) and f":{line}:" in str(info.value)


def test_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("ok X\n\ncaf\u00e9 X\n".encode("latin-1"))
    with pytest.raises(DataFormatError, match=r"latin1.txt:3: not valid UTF-8"):
        read_conll(path)


def test_truncated_gzip_is_reported(tmp_path):
    path = tmp_path / "cut.txt.gz"
    data = gzip.compress(("word X\n" * 2000).encode())
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataFormatError, match="cannot read file"):
        read_conll(path)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_conll(tmp_path / "nope.txt")


CONLLU = """# sent_id = 1
# text = I can't go.
1\tI\tI\tPRON\tPRP\t_\t3\tnsubj\t_\t_
2-3\tcan't\t_\t_\t_\t_\t_\t_\t_\t_
2\tca\tcan\tAUX\tMD\t_\t3\taux\t_\t_
3\tn't\tnot\tPART\tRB\t_\t0\troot\t_\t_
3.1\tgo\tgo\tVERB\tVB\t_\t_\t_\t_\t_
4\t.\t.\tPUNCT\t.\t_\t3\tpunct\t_\t_

"""


def test_reads_conllu_word_lines_only(tmp_path):
    path = tmp_path / "a.conllu"
    path.write_text(CONLLU, encoding="utf-8")
    (sentence,) = read_conllu(path)
    assert [row[1] for row in sentence] == ["I", "ca", "n't", "."]
    assert [row[3] for row in sentence] == ["PRON", "AUX", "PART", "PUNCT"]


@pytest.mark.parametrize(
    "line,problem",
    [
        ("1\tI\tI\tPRON\tPRP\t_\t3\tnsubj\t_\n", "expected 10 tab-separated columns, found 9"),
        ("x\tI\tI\tPRON\tPRP\t_\t3\tnsubj\t_\t_\n", "word ID 'x' is not an integer"),
    ],
)
def test_malformed_conllu(tmp_path, line, problem):
    path = tmp_path / "bad.conllu"
    path.write_text("# c\n" + line, encoding="utf-8")
    with pytest.raises(DataFormatError) as info:
        read_conllu(path)
    assert info.value.line == 2 and problem in str(info.value)


def test_empty_conllu(tmp_path):
    path = tmp_path / "empty.conllu"
    path.write_text("", encoding="utf-8")
    with pytest.raises(DataFormatError, match="empty.conllu:1: file is empty"):
        read_conllu(path)


XML = """<?xml version="1.0" encoding="UTF-8"?>
<dataset>
  <sequence>
    <author>Romero, C., &amp; Dweck,
      C.</author>
    <date>(2011).</date>
    <title>Brainology.</title>
  </sequence>
  <sequence>
    <citation-number>60.</citation-number>
    <journal>J Endod,</journal>
  </sequence>
</dataset>
"""

XML_EXPECTED = [
    [
        ("Romero,", "B-author"),
        ("C.,", "I-author"),
        ("&", "I-author"),
        ("Dweck,", "I-author"),
        ("C.", "I-author"),
        ("(2011).", "B-date"),
        ("Brainology.", "B-title"),
    ],
    [("60.", "B-citation-number"), ("J", "B-journal"), ("Endod,", "I-journal")],
]


def test_reads_xml_sequences_as_iob2_fields(tmp_path):
    path = tmp_path / "refs.xml"
    path.write_text(XML, encoding="utf-8")
    assert read_xml_sequences(path) == XML_EXPECTED


def test_reads_gzip_xml_sequences(tmp_path):
    path = tmp_path / "refs.xml.gz"
    path.write_bytes(gzip.compress(XML.encode("utf-8")))
    assert read_xml_sequences(path) == XML_EXPECTED


def test_xml_field_labels_round_trip_through_chunks(tmp_path):
    """Every field becomes exactly one conlleval chunk of its type, in document order."""
    from crf.metrics import chunks

    path = tmp_path / "refs.xml"
    path.write_text(XML, encoding="utf-8")
    found = chunks([[label for _, label in s] for s in read_xml_sequences(path)])
    assert list(found["type"]) == ["author", "date", "title", "citation-number", "journal"]


@pytest.mark.parametrize(
    "content,line,problem",
    [
        ("<dataset>\n<sequence>\n<author>A</title>\n</sequence>\n</dataset>\n", 3, "malformed XML: mismatched tag"),
        ("<dataset>\n<sequence>\n<author>A</author>\n", 4, "malformed XML: no element found"),
        ("", 1, "malformed XML: no element found"),
        (
            "<dataset>\n<sequence>\nSmith <author>A</author>\n</sequence>\n</dataset>\n",
            3,
            "'Smith' inside <sequence> but outside",
        ),
        ("<dataset>\nstray\n<sequence><author>A</author></sequence>\n</dataset>\n", 2, "'stray' outside any <sequence>"),
        ("<dataset>\n<sequence>\n<author>A <b>B</b></author>\n</sequence>\n</dataset>\n", 3, "element <b> nested inside a field"),
        ("<dataset>\n<sequence>\n<note> </note>\n</sequence>\n</dataset>\n", 3, "field <note> holds no tokens"),
        ("<dataset>\n<sequence>\n</sequence>\n</dataset>\n", 3, "empty <sequence>"),
        ("<dataset>\n</dataset>\n", 2, "holds no <sequence> elements"),
        ("<references/>\n", 1, "document element is <references>, expected <dataset>"),
        ("<dataset>\n<item><author>A</author></item>\n</dataset>\n", 2, "<item> inside <dataset>, expected <sequence>"),
    ],
)
def test_malformed_xml_sequences_name_file_line_and_problem(tmp_path, content, line, problem):
    path = tmp_path / "bad.xml"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataFormatError) as info:
        read_xml_sequences(path)
    assert info.value.line == line, str(info.value)
    assert problem in str(info.value)
    assert str(info.value).startswith(f"{path}:{line}:")


@pytest.mark.parametrize(
    "doctype",
    [
        # an external entity: must never be read
        '<!DOCTYPE dataset [<!ENTITY secret SYSTEM "file:///etc/hostname">]>',
        # an exponential internal entity ("billion laughs"): must never be expanded
        '<!DOCTYPE dataset [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]>',
        # a bare document type declaration
        "<!DOCTYPE dataset>",
    ],
)
def test_xml_document_type_declarations_are_refused(tmp_path, doctype):
    path = tmp_path / "dtd.xml"
    path.write_text(f'<?xml version="1.0"?>\n{doctype}\n<dataset><sequence><author>&b;</author></sequence></dataset>\n')
    with pytest.raises(DataFormatError, match=r"dtd.xml:2: document type declaration <!DOCTYPE dataset> refused"):
        read_xml_sequences(path)


def test_xml_undeclared_entity_is_an_error(tmp_path):
    path = tmp_path / "ent.xml"
    path.write_text("<dataset>\n<sequence><author>&secret;</author></sequence>\n</dataset>\n")
    with pytest.raises(DataFormatError, match=r"ent.xml:2: malformed XML: undefined entity"):
        read_xml_sequences(path)


def test_missing_xml_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_xml_sequences(tmp_path / "nope.xml")


# --- byte-order marks, folders, trailing separators, truncated gzip (all readers) -----------------

from crf.io import read_blocks  # noqa: E402


def _cut_gzip(text: str) -> bytes:
    """A gzip stream of ``text`` cut in the middle (the text is varied so the stream is long)."""
    data = gzip.compress(text.encode())
    return data[: len(data) // 2]


def _numbered_conll(n: int) -> str:
    return "".join(f"w{i} X{i % 7}\n" + ("\n" if i % 10 == 9 else "") for i in range(n))


def test_utf8_bom_is_not_part_of_the_first_token(tmp_path):
    path = tmp_path / "bom.txt"
    path.write_bytes(b"\xef\xbb\xbfThe DT B-NP\ndog NN I-NP\n")
    assert read_conll(path) == [[("The", "DT", "B-NP"), ("dog", "NN", "I-NP")]]
    packed = tmp_path / "bom.txt.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert read_conll(packed, separator=" ") == read_conll(path)
    conllu = tmp_path / "bom.conllu"
    conllu.write_bytes(b"\xef\xbb\xbf" + CONLLU_WORD + b"\n")
    assert read_conllu(conllu)[0][0][:2] == ("1", "The")
    no_declaration = tmp_path / "bom.xml"
    no_declaration.write_bytes(b"\xef\xbb\xbf<dataset><sequence><title>A b</title></sequence></dataset>")
    assert read_xml_sequences(no_declaration) == [[("A", "B-title"), ("b", "I-title")]]


def test_a_bom_later_in_the_file_is_still_an_error(tmp_path):
    path = tmp_path / "late.txt"
    path.write_bytes("a X\n\ufeffb X Y\n".encode())
    with pytest.raises(DataFormatError, match="late.txt:2: expected 2 columns"):
        read_conll(path)


def test_utf16_file_says_so(tmp_path):
    path = tmp_path / "utf16.txt"
    path.write_bytes("a X\n".encode("utf-16"))
    with pytest.raises(DataFormatError, match="utf16.txt:1: the file is UTF-16"):
        read_conll(path)


@pytest.mark.parametrize("reader", [read_conll, read_conllu, read_xml_sequences])
def test_a_directory_is_reported_as_a_directory(tmp_path, reader):
    with pytest.raises(IsADirectoryError, match=f"{tmp_path}: is a directory"):
        reader(tmp_path)


def test_trailing_separators_are_not_columns(tmp_path):
    path = tmp_path / "tabs.tsv"
    path.write_text("York\tNNP\tB-LOC\t\nis\tVBZ\tO\t\t\n", encoding="utf-8")
    assert read_conll(path, n_columns=3, separator="\t") == [[("York", "NNP", "B-LOC"), ("is", "VBZ", "O")]]
    inner = tmp_path / "inner.tsv"
    inner.write_text("a\t\tO\n", encoding="utf-8")  # an empty cell inside the row is still an error
    with pytest.raises(DataFormatError, match="inner.tsv:1: empty column"):
        read_conll(inner, n_columns=3, separator="\t")
    conllu = tmp_path / "tab.conllu"
    conllu.write_bytes(CONLLU_WORD + b"\t\n")
    assert len(read_conllu(conllu)[0][0]) == 10
    short = tmp_path / "short.conllu"
    short.write_bytes(CONLLU_WORD.rsplit(b"\t", 1)[0] + b"\t\n")  # 9 columns and a final tab
    with pytest.raises(DataFormatError, match="short.conllu:1: expected 10 tab-separated columns, found 9"):
        read_conllu(short)


def test_truncated_gzip_names_file_and_line_reached(tmp_path):
    path = tmp_path / "cut.txt.gz"
    path.write_bytes(_cut_gzip(_numbered_conll(20000)))
    with pytest.raises(DataFormatError) as info:
        read_conll(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{info.value.line}: cannot read file: truncated or corrupt gzip stream")
    assert info.value.line > 100 and f"after {info.value.line - 1} complete lines" in message


def test_corrupt_gzip_is_a_data_format_error(tmp_path):
    data = bytearray(gzip.compress(_numbered_conll(20000).encode()))
    data[-6] ^= 0xFF  # the CRC-32 of the trailer: every line decodes, the check at the end fails
    path = tmp_path / "flipped.txt.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(
        DataFormatError, match="flipped.txt.gz:22001: cannot read file: truncated or corrupt gzip stream, BadGzip"
    ):
        read_conll(path)


def test_truncated_gzip_xml_and_conllu(tmp_path):
    xml = tmp_path / "cut.xml.gz"
    xml.write_bytes(_cut_gzip("<dataset>\n" + "".join(f"<sequence><title>t{i} x</title></sequence>\n" for i in range(20000))))
    with pytest.raises(DataFormatError, match=r"cut.xml.gz:[0-9]+: cannot read file: truncated or corrupt gzip stream"):
        read_xml_sequences(xml)
    conllu = tmp_path / "cut.conllu.gz"
    conllu.write_bytes(_cut_gzip("".join(f"{i % 9 + 1}\tw{i}\t_\tX\t_\t_\t0\troot\t_\t_\n" for i in range(20000))))
    with pytest.raises(DataFormatError, match=r"cut.conllu.gz:[0-9]+: cannot read file: truncated"):
        read_conllu(conllu)


def test_read_blocks_is_the_decompressed_text(tmp_path):
    text = _numbered_conll(5000).encode()
    path = tmp_path / "whole.txt.gz"
    path.write_bytes(gzip.compress(text))
    assert b"".join(read_blocks(path, size=1000)) == text
    (tmp_path / "plain.txt").write_bytes(text)
    assert b"".join(read_blocks(tmp_path / "plain.txt")) == text


CONLLU_WORD = b"1\tThe\tthe\tDET\tDT\tDefinite=Def\t2\tdet\t_\t_"


def test_directive_lines_only_where_named(tmp_path):
    """``-DOCSTART-`` and ``#`` lines: skipped only when named; a ``#`` inside a sentence stays a token."""
    path = tmp_path / "a.txt"
    path.write_text("# id 1\n# SYM O\n-DOCSTART- NNP B-NP\n\ndog NN B-NP\n# SYM O\n\n-DOCSTART- -X- O\n", encoding="utf-8")
    everything = read_conll(path, comment_prefix=None, document_marker=None)
    assert everything == [
        [("#", "id", "1"), ("#", "SYM", "O"), ("-DOCSTART-", "NNP", "B-NP")],
        [("dog", "NN", "B-NP"), ("#", "SYM", "O")],
        [("-DOCSTART-", "-X-", "O")],
    ]
    named = read_conll(path, comment_prefix="#", document_marker="-DOCSTART-")
    assert named == [[("dog", "NN", "B-NP"), ("#", "SYM", "O")]]  # the header lines and the document lines go
    # the library's default still skips CoNLL-2003 document lines (and has no comments)
    assert read_conll(path)[0] == [("#", "id", "1"), ("#", "SYM", "O")]
    with pytest.raises(ValueError, match="comment_prefix"):
        read_conll(path, comment_prefix="")


@pytest.mark.parametrize("name", ["m" * 251 + ".npz", "é" * 125 + ".txt", "m" * 240 + "é" * 3])
def test_a_file_name_near_the_length_limit_is_written(tmp_path, name):
    """The temporary file beside the target had the target's name plus 18 bytes, so a legal name of
    238 to 255 bytes failed after the work was done (after training, for a model file)."""
    assert len(os.fsencode(name)) <= 255
    atomic_write(tmp_path / name, lambda out: out.write(b"data"))
    assert (tmp_path / name).read_bytes() == b"data" and [p.name for p in tmp_path.iterdir()] == [name]


def test_a_conll_file_with_cr_line_ends_is_named_not_read_as_one_line(tmp_path):
    """CR is whitespace to the cell split, so such a file was one line of thousands of cells, and
    the advice was to name its columns (K11); CRLF files read as LF ones."""
    cr, crlf = tmp_path / "cr.conll", tmp_path / "crlf.conll"
    cr.write_bytes(b"a DT B-NP\rb NN I-NP\r\rc VB B-VP\r")
    crlf.write_bytes(b"a DT B-NP\r\nb NN I-NP\r\n\r\nc VB B-VP\r\n")
    with pytest.raises(DataFormatError, match=r"cr.conll:1: a carriage return inside a line: the file's lines end in CR alone"):
        read_conll(cr)
    assert read_conll(crlf) == [[("a", "DT", "B-NP"), ("b", "NN", "I-NP")], [("c", "VB", "B-VP")]]
