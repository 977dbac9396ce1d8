"""What the pipeline writes for people and programs to read: Markdown tables (pandas + tabulate),
matplotlib figures, strict JSON, and URLs without their passwords.

Strict JSON for what other programs read: the stages' JSON files and the tag command's JSONL.

Python's ``json`` writes ``NaN`` and ``Infinity`` for non-finite floats, which is not JSON: strict
parsers (JavaScript's ``JSON.parse``, ``jq``, Go, Java) refuse the file. Every JSON file the
pipeline writes goes through :func:`dumps`, which writes a non-finite number as ``null`` (a
missing value: e.g. the accuracy on unknown words when a split has none) and then serialises with
``allow_nan=False``, so no ``NaN`` literal can slip through. numpy scalars and arrays become plain
numbers and lists.
"""

from __future__ import annotations

import base64
import json
import math
import re
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from crf.io import atomic_write


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub-style Markdown table of ``frame`` (index not included) by ``DataFrame.to_markdown``:
    missing values blank, booleans True/False, whole or large numbers with thousands separators
    and no decimals, other numbers to 4 significant digits."""
    formats = []
    for name in frame.columns:
        column = frame[name]
        numbers = pd.to_numeric(column, errors="coerce") if column.dtype != bool else pd.Series(dtype=float)
        numbers = numbers.dropna()
        large = not numbers.empty and (numbers.abs().max() >= 1000 or (numbers == numbers.round()).all())
        formats.append(",.0f" if large else ".4g")
    cells = frame.astype(object).map(lambda v: str(v) if isinstance(v, (bool, np.bool_)) else v)  # not 1/0
    cells = cells.astype(object).where(frame.notna(), None)
    return cells.to_markdown(index=False, missingval="", floatfmt=formats, intfmt=",")


def figure(width: float, height: float, columns: int = 1):
    """A matplotlib figure (headless backend) with ``columns`` axes side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, columns, figsize=(width, height), squeeze=False)
    return fig, list(axes[0])


def log_scale(ax, which: str) -> None:
    """Put axis ``which`` (``"x"`` or ``"y"``) of the matplotlib axes ``ax`` on a log scale labelled
    in plain numbers (``400``, ``1000``, ``1e-02``): matplotlib's default labels are TeX (``10^3``),
    whose parser costs more than the rest of a small figure and reads worse over less than a decade."""
    import matplotlib.ticker as ticker

    getattr(ax, f"set_{which}scale")("log")
    axis = getattr(ax, f"{which}axis")
    axis.set_major_formatter(ticker.LogFormatter(labelOnlyBase=False))
    axis.set_minor_formatter(ticker.LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))


def save_figure(fig, path) -> None:
    """Lay out, write as PNG and release the figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- strict JSON ---


def finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None, recursively (mappings, lists,
    tuples, numpy arrays and scalars); mapping keys become strings."""
    if isinstance(value, Mapping):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    if isinstance(value, np.ndarray):
        return [finite(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """Strict JSON text of ``value`` (non-finite numbers as ``null``; see the module docstring)."""
    return json.dumps(finite(value), allow_nan=False, **kwargs)


def write_json(path: str | Path, value: Any, indent: int | None = 1) -> None:
    """Write ``value`` as strict JSON to ``path``, atomically (a reader never sees half a file)."""
    data = (dumps(value, indent=indent) + "\n").encode("utf-8")
    atomic_write(path, lambda out: out.write(data))


# a URL's scheme and "://" (not a scheme's tail: "pysqlite" of "sqlite+pysqlite"), with any further
# "/" (a user or password may follow them: "http:///u:pw@h" sends nothing, but its secret is one all
# the same), except after SQLite's and a file's "://", where a "/" starts a path ("sqlite:////a@b/x"
# has no user, "sqlite://u:pw@h/x" has one); schemes in any case ("HTTP://")
_PATH_SCHEMES = r"(?i:sqlite|file)(?:\+[A-Za-z0-9_]+)?"
_FULL_SCHEME = rf"(?<![A-Za-z0-9+.-])(?:{_PATH_SCHEMES}://|(?!{_PATH_SCHEMES}://)[A-Za-z][A-Za-z0-9+.-]*:///*)"
# and a scheme written with fewer slashes ("http:u:pw@h", "postgresql:/u:pw@db"): its secret is one
# too (a word, a colon and a word with "@", "mailto:a@b.org", loses that word: only a log's detail)
_FEWER_SLASHES = rf"(?<![A-Za-z0-9+.-])(?!{_PATH_SCHEMES}:)[A-Za-z][A-Za-z0-9+.-]*:/?(?!/)"
_SCHEME = f"({_FULL_SCHEME})"
_ANY_SCHEME = f"({_FULL_SCHEME}|{_FEWER_SLASHES})"
_SHORT_USERINFO = re.compile(f"({_FEWER_SLASHES})" + r"([^\s/@]\S*)@")  # a raw "/" in the password too
# scheme://userinfo@: up to the last "@" of the word, so that a password holding a raw "@" or "/"
# is covered too (a path with "@" in it is hidden along with it, which only costs a log's detail)
_USERINFO = re.compile(_SCHEME + r"([^\s/]\S*)@")
# and a user or password holding a raw space (any: a tab, a no-break space): up to the last "@" on
# the line, so that a raw "/" beside the space is covered too (a line with a URL, a space and a
# later "@", an e-mail address, loses that stretch as well: only a log's detail)
_SPACED_USERINFO = re.compile(_ANY_SCHEME + r"(?!\*\*\*@)([^\s@/][^\n]*?[^\S\n][^\n]*)@")
# and one broken by a raw line break (an environment variable can hold one): the rest of the line
# (a raw "/" or "@" in it too), then the next line up to its first "@" (a URL at a line's end and an
# e-mail address on the next line lose that stretch as well: only a log's detail)
_BROKEN_USERINFO = re.compile(_ANY_SCHEME + r"(?!\*\*\*@)([^\s@/][^\n]*\n[^\n@]*)@")


# and after any "://" that none of these took for a scheme's ("1https://u:pw@h", "-https://...")
_ANY_USERINFO = re.compile(r"(://)(?!\*\*\*@)[^\s/]\S*@")
# a scheme as Hydra escapes it in the overrides it prints ("https\://u\:pw@h"), and Hydra's escapes
_ESCAPED_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*\\:")
_HYDRA_ESCAPE = re.compile(r"\\([\\()\[\]{}:=, \t'\"])")


def _hidden_userinfo(userinfo: str) -> str:
    # the user goes too: it may be the token itself (GitHub's https://<token>:x-oauth-basic@,
    # an API key with an empty password)
    return "***"


def _hidden(found: re.Match) -> str:
    return f"{found.group(1)}{_hidden_userinfo(found.group(2))}@"


# a query parameter: ?name=value or &name=value (or a fragment's, #access_token=value); a ";" may
# separate parameters (older servers) or belong to the value (servers that split on "&" only)
_QUERY_PARAMETER = re.compile(r"([?&;#])([^=&;#\s]*)=([^&#\s]*)")
# a parameter name (percent-decoded, as the server reads it) that names a secret: token, api_key,
# X-Amz-Signature, password, pass, pw, pwd, session, jwt, auth, credential, ...
_SECRET_NAME = re.compile(r"token|key|secret|pass|pw|sig|auth|credential|session|jwt|bearer|cookie", re.I)


def _hidden_value(found: re.Match) -> str:
    start, name, value = found.groups()
    if _SECRET_NAME.search(urllib.parse.unquote_plus(name)):
        return f"{start}{name}=***"  # all of it, a ";" included
    head, semicolon, rest = value.partition(";")
    return f"{start}{name}={head}" + (_QUERY_PARAMETER.sub(_hidden_value, semicolon + rest) if semicolon else "")


def redacted(text: str) -> str:
    """``text`` with the secret of every URL in it hidden: ``scheme://user:password@`` becomes
    ``scheme://***@``, user and all (the user may be the token; a password holding a raw ``/``, ``@``, space or
    line break included), and the value of a query or fragment parameter whose
    name (percent-decoded) holds a word of a secret (``?token=``, ``&api_key=``,
    ``&X-Amz-Signature=``, ``?pass=``, ``?pw=``, ``?session=``, ``#access_token=``) ``***``; for
    logs, run parameters and results files."""
    text = str(text)
    if _ESCAPED_SCHEME.search(text):  # as Hydra quotes an override (its job lines, a sweep's job label)
        text = _HYDRA_ESCAPE.sub(r"\1", text)
    hidden = _USERINFO.sub(_hidden, _SPACED_USERINFO.sub(_hidden, _BROKEN_USERINFO.sub(_hidden, text)))
    hidden = _SHORT_USERINFO.sub(_hidden, _ANY_USERINFO.sub(r"\1***@", hidden))
    return _QUERY_PARAMETER.sub(_hidden_value, hidden)


_URL_START = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):(/*)(.*)", re.DOTALL)  # scheme, its slashes, the rest


def shown_url(url: str) -> str:
    """``url`` as a message quotes it: its user and password hidden, whatever characters they hold
    (everything between the scheme's ``:`` and slashes and the URL's last ``@``; not in a SQLite or
    file path), then :func:`redacted`, and cut at its first whitespace (a URL that holds one is
    refused, and a secret's value would go on past it)."""
    url = str(url).strip().strip("'\"").strip()  # quoted or padded, as an environment variable may hold it
    found = _URL_START.search(url)  # a stray character before the scheme ("1https://u:pw@h") included
    if found:  # any number of slashes: "http:u:pw@h" and "http:///u:pw@h" hold a secret all the same
        scheme, slashes, rest = found.groups()
        path_only = scheme.lower().split("+")[0] in ("sqlite", "file") and slashes != "//"  # "sqlite:////a@b/x": no user
        if "@" in rest and not path_only:
            userinfo, _, place = rest.rpartition("@")
            url = f"{url[: found.start()]}{scheme}:{slashes}{_hidden_userinfo(userinfo)}@{place}"
    shown = redacted(url)
    return shown if shown.split() == [shown] else (shown.split() or [""])[0] + " ..."


def redacted_values(value: Any) -> Any:
    """``value`` (nested dicts and lists, as ``OmegaConf.to_container`` gives) with every string in
    it as :func:`redacted` shows it: a URL's secret hidden in each value, before any format (YAML
    folds a line break into a blank line) spreads one over several lines."""
    if isinstance(value, Mapping):
        return {key: redacted_values(item) for key, item in value.items()}
    if isinstance(value, list):
        return [redacted_values(item) for item in value]
    return redacted(value) if isinstance(value, str) else value


def shown_override(override: str) -> str:
    """A command-line override ``key=value`` as a message quotes it, on one line: a value that holds
    a URL with a user or password as :func:`shown_url` shows it (whatever characters the secret
    holds), the rest as :func:`redacted` shows it, line breaks written as ``\\n``."""
    key, equals, value = override.partition("=")
    if equals and "@" in value and _URL_START.search(value):
        value = shown_url(value)
    return redacted(key + equals + value).replace("\r", "\\r").replace("\n", "\\n")


def authority_problem(url: str) -> str | None:
    """Why an http(s) ``url`` cannot be requested, in a few words that quote none of it, or None: its
    ``host:port`` part is not one (a user or password holding a raw ``/``, ``?`` or ``#`` ends that
    part early, so urllib would take what comes before the character for a port and quote it in
    its error: the password's first characters; a raw ``[`` or ``]`` reads as an IPv6 address), or
    it holds whitespace or a control character."""
    try:  # urllib's errors quote the part they could not read: the password's first characters
        parts = urllib.parse.urlsplit(url)
        _, host = parts.port, parts.hostname
    except ValueError:
        return (
            "its host:port part is no host and port number (a '/', '?', '#', '[', ']' or at sign in a user or password "
            "must be percent-encoded: %2F, %3F, %23, %5B, %5D, %40)"
        )
    if not host:
        return "it names no host"
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        return "it holds a space or control character (write a space as %20)"
    return None


def request_with_credentials(url: str) -> urllib.request.Request:
    """An HTTP request for ``url`` that sends the user and password the URL holds
    (``https://user:password@host/...``, percent-encoded as URLs write them) as basic
    authentication, and the URL without them: urllib itself takes none from the URL (it reads
    ``password@host`` as a port). They go to that URL only: a redirect is followed without them
    (urllib would otherwise hand them to whatever host the redirect names)."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None:
        return urllib.request.Request(url)
    request = urllib.request.Request(urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])))
    secret = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
    request.add_unredirected_header("Authorization", "Basic " + base64.b64encode(secret.encode()).decode())
    return request
