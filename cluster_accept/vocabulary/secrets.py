"""Mask secrets in text that came from a node, where it enters the controller: by name, and by shape. Pure
functions.

A check may mask what it knows to be secret on the node (``checks.nccl_env``'s awk); this is the line every node's
output passes, applied where it enters the controller (``remote/``), before any parser reads it. It masks:

- **by name**: in any ``NAME=value``, ``NAME = value``, ``export NAME=value`` or ``NAME: value``, the value of
  a secret name becomes ``***`` up to the end of its line; the name stays, so the operator sees that a value
  was there. A name is secret (any case) when it holds TOKEN, KEY, SECRET, PASSWORD, PASSWD, PASSPHRASE,
  CREDENTIAL, COOKIE, AUTH or AUTHORIZATION (each also with a plural S) not followed by another letter
  (``API_KEY``, ``APIKEY``, ``KEYS`` and ``AUTH2`` are; ``KEYBOARD``, ``TOKENIZERS_PARALLELISM`` and
  ``AUTHOR`` are not); or a PASS or PAT word of its own (``DB_PASS``, ``GITHUB_PAT``; not ``BYPASS``,
  ``PATH``); or a PWD word after something else (``MYSQL_PWD``; not ``PWD`` or ``OLDPWD``, the working
  directories). SESSION is no secret word (``XDG_SESSION_ID``): a session's token or key is caught by its TOKEN
  or KEY. A rate of tokens (``TOKENS_PER_…``: ``training_tokens_per_s_per_gpu``) is a throughput, not a secret (on
  the controller; NCCL variables have no such names). ``NCCL_IB_PKEY`` and ``UCX_IB_PKEY`` (an InfiniBand partition
  key index) are not secrets, nor the nccl_env check's ``nccl_keys`` (the names of a node's NCCL variables, compared
  across nodes). Empty values, values already masked (asterisks only, like the check's own ``****``) and
  placeholders (``<unset>``, ``<set> (majority)``) are left as they are. :data:`SECRET_NAME_ERE` is a POSIX extended
  regular expression over the upper-cased name, so that the node-side awk of ``checks.nccl_env`` applies the very
  same rule;
- **by shape**, whatever the name and wherever the text holds it: the password of a URL
  (``postgres://user:***@host/db``), whatever it holds (``/`` as base64 has it, ``@``, ``:``): it runs to the
  last ``@`` of the URL's whitespace-free token, or of its quoted string when a quote opens the URL; tokens with a
  well-known prefix and a realistic length, the prefix kept (``ghp_***``): GitHub (``ghp_ gho_ ghu_ ghs_ ghr_
  github_pat_``), GitLab (``glpat-``), Slack (``xoxa- xoxb- xoxp- xoxr- xoxs-``), AWS access key ids
  (``AKIA``/``ASIA`` and 16 upper-case letters or digits), Hugging Face (``hf_``), OpenAI-style keys
  (``sk-proj-``, ``sk-svcacct-``, ``sk-admin-`` and ``sk-ant-`` with 20 or more characters; ``sk-`` and 32 or
  more with a digit, or with upper and lower case mixed in one hyphen-free part of 12 or more: a long hyphenated
  word is no key), Stripe live keys, npm and PyPI tokens, Google API keys and JSON Web Tokens
  (``eyJ….eyJ….…``); private-key blocks (``-----BEGIN … PRIVATE KEY-----`` to its END line, the markers kept),
  whole: a block cut off before its END line is masked to the end of the text, one whose BEGIN line was cut off
  from the start of its base64 lines;
- **in command lines and headers**: curl's password (``-u user:***``, ``-uuser:***``, ``--user user:***``,
  ``--proxy-user``, ``-U``; not a numeric ``uid:gid`` as ``docker run -u 1000:1000`` takes it); the value of a
  secret-named option given after a space (``--password ***``, ``--hf-token ***``; not the usage line's own
  metavar, ``[--token TOKEN]``); ``sshpass -p ***`` and ``docker login … -p ***`` (podman, nerdctl, buildah,
  skopeo, oras, helm registry); ``mysql … -p***`` (attached, as mysql takes it: ``-p`` alone asks); a ``.netrc``
  password (``machine h login u password ***``); NCCL's log of a secret-named variable it took (``NCCL_X_TOKEN set
  by environment to ***``); ``Bearer ***`` (16 or more token characters with a digit or
  mixed case) and ``Basic ***`` (base64 of ``user:password``). The option's or scheme's word stays.

What a terminal draws as nothing cannot hide a secret from these patterns: a colour code right before a token
(``\x1b[31mAKIA…``, ``grep --color`` around a name), a title or hyperlink sequence, a zero-width or bidi character
between a key's characters, a backspace. Text holding any is masked a second time with them taken out; when that
masks more, the text is kept in that plain form (masked), else as it came. A bare CR is an overprint, not a line's
end: a secret value runs on past it to the newline.

Every pattern runs in time linear in the text (node output may be long and hostile).

Node text is masked once, where it enters the controller (``remote/``: :func:`masked_cap`, :func:`masked_tail`),
and says so in its type: :data:`MaskedText`, made by this module's functions and, outside it, only in
``remote/`` (``tests/test_masking_once.py`` holds it). Everything above cuts it with :mod:`vocabulary.text`
and masks it no more; text the controller writes itself (an inventory's value, a traceback) may be masked where
it is written.
"""

from __future__ import annotations

import base64
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import NewType

from cluster_accept.vocabulary.text import keep_head, keep_tail, uncut

# Node text as the controller holds it once it entered: masked (and capped) there, never to be masked again.
MaskedText = NewType("MaskedText", str)

MASK = "***"
_WORDS = "TOKEN|KEY|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|COOKIE|AUTH|AUTHORIZATION"
SECRET_NAME_ERE = f"({_WORDS})S?([^A-Z]|$)|(^|[^A-Z])(PASS|PAT)S?([^A-Z]|$)|[^A-Z]PWD([^A-Z]|$)"
_SECRET_NAME = re.compile(SECRET_NAME_ERE)
# NCCL_IB_PKEY, UCX_IB_PKEY: an InfiniBand partition key index; nccl_keys: the nccl_env check's set of names.
NOT_SECRET_NAMES = frozenset({"NCCL_IB_PKEY", "UCX_IB_PKEY", "nccl_keys"})
# A rate of tokens (``training_tokens_per_s_per_gpu``, ``tokens_per_s``) is a throughput, not a secret.
_RATE = re.compile(r"TOKENS?_PER_")
# A name (not the tail of a longer word, nor a URL's user; an option's dashes before it), an optional closing
# quote (JSON, repr) and the separator.
_ASSIGNMENT = re.compile(r"(?<![\w./-])-{0,2}(?P<name>[A-Za-z_][\w.-]*)[\"']?[ \t]*[=:][ \t]*")
_LINE_END = re.compile(r"\r?\n")  # a bare CR overprints the line (``TOKEN=a\rb``): the value runs on past it
# What a terminal draws as nothing, yet splits a token or a name for the patterns here: ECMA-48 sequences (CSI with
# its parameters, the final byte optional for one cut off; OSC, DCS, SOS, PM and APC strings to their end or the
# line's; other escapes; their 8-bit forms), a character a backspace takes back, other C0 and C1 controls but tab,
# newline and CR, and zero-width, soft-hyphen and bidi format characters.
_HIDDEN = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]?"
    r"|[^\n\x08]?\x08"
    r"|[\x00-\x07\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064"
    r"\u2066-\u2069\ufeff]"
)
_MAY_HIDE = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]"
)
# Not a value: already masked (the check's own ``****``) or a placeholder (``<unset> (majority)``, ``<value>``).
_NOT_A_VALUE = re.compile(r"(?:\*+|<[a-z]+>)(?: \([a-z]+\))?")

# A URL up to the ``:`` that ends its user; the user may hold an ``@`` (``https://me@corp.com:pw@host``). Its
# password is found by :func:`_mask_url_passwords`: a regex scanning each ``://`` to the end of its token would be
# quadratic in a long token holding many of them.
_URL_USER = re.compile(r"://(?<=[A-Za-z0-9+.-]://)[^\s:/\"'<>]*:")
_SPACE = re.compile(r"\s")
_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-")
_SCHEME_MAX = 64  # a longer run before ``://`` is not looked through for an opening quote
# The quote that closes a quoted URL: not one escaped inside it (JSON's ``\"``).
_CLOSING = {'"': re.compile(r'(?<!\\)"'), "'": re.compile(r"(?<!\\)'")}
# (prefix kept, the rest): the prefix alone is not a secret and tells the operator what was there.
_TOKENS = (
    ("github_pat_", r"[A-Za-z0-9_]{22,}"),
    ("gh[pousr]_", r"[A-Za-z0-9]{30,}"),
    ("glpat-", r"[A-Za-z0-9_-]{20,}"),
    ("xox[abprs]-", r"[A-Za-z0-9-]{10,}"),
    ("A(?:KI|SI)A", r"[A-Z0-9]{16}(?![A-Za-z0-9])"),
    ("hf_", r"[A-Za-z0-9]{30,}"),
    ("sk-(?:proj|svcacct|admin|ant)-", r"[A-Za-z0-9_-]{20,}"),
    ("sk-", r"[A-Za-z0-9_-]{32,}"),  # only when it looks random (see _mask_token)
    ("[rs]k_live_", r"[A-Za-z0-9]{24,}"),
    ("npm_", r"[A-Za-z0-9]{36,}"),
    ("pypi-", r"AgE[A-Za-z0-9_-]{50,}"),
    ("AIza", r"[A-Za-z0-9_-]{35}(?![A-Za-z0-9_-])"),
    ("eyJ", r"[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"),
)
_TOKEN = re.compile(  # the lookahead (every prefix's first letter) lets most positions fail at once
    "(?<![A-Za-z0-9])(?=[Aeghnprsx])(?:"
    + "|".join(f"(?P<t{i}>{prefix}){rest}" for i, (prefix, rest) in enumerate(_TOKENS))
    + ")"
)
_KEY_MARK = re.compile(r"-----(?P<edge>BEGIN|END) [A-Z0-9 ]{0,64}PRIVATE KEY(?: BLOCK)?-----")
_KEY_END = re.compile(r"-----END [A-Z0-9 ]{0,64}PRIVATE KEY(?: BLOCK)?-----")
# What a private key's body holds, line by line: base64, headers (``Proc-Type: 4,ENCRYPTED``), or the mask.
_KEY_LINE = re.compile(r"[A-Za-z0-9+/=]*|\*+|[A-Za-z-]+: .*")


@functools.lru_cache(maxsize=8192)  # the same few names on every node
def is_secret_name(name: str) -> bool:
    return name not in NOT_SECRET_NAMES and _SECRET_NAME.search(_RATE.sub("_", name.upper())) is not None


def _maskable(value: str) -> bool:
    value = value.strip()
    return bool(value) and not _NOT_A_VALUE.fullmatch(value)


def _mask_token(match: re.Match[str]) -> str:
    prefix = next(group for group in match.groups() if group is not None)
    token = match.group(0)
    if prefix == "sk-" and not _looks_random(token[3:]):
        return token  # a long hyphenated word, not a key
    return prefix + MASK


def _looks_random(word: str) -> bool:
    """A digit, or upper and lower case mixed in one hyphen-free part of 12 or more characters: what tells a key
    (``sk-AbCdEf…``) from a long hyphenated word (``sk-only-letters-in-a-long-name``) or prose."""
    if any(c.isdigit() for c in word):
        return True
    parts = word.split("-")
    return any(len(p) >= 12 and not p.islower() and not p.isupper() and p.lower() != p.upper() for p in parts)


def _body_start(text: str, floor: int, end: int) -> int:
    """Where the base64 lines before an END marker at ``end`` begin (not before ``floor``)."""
    start = end
    while start > floor:
        line_start = max(text.rfind("\n", floor, start - 1) + 1, floor)
        if not _KEY_LINE.fullmatch(text[line_start:start].rstrip("\r\n")):
            break
        start = line_start
    return start


def _mask_private_keys(text: str) -> str:
    parts: list[str] = []
    pos = 0
    while (mark := _KEY_MARK.search(text, pos)) is not None:
        if mark.group("edge") == "BEGIN":
            end = _KEY_END.search(text, mark.end())
            parts += [text[pos : mark.end()], "\n" + MASK]
            if end is None:
                return "".join(parts)
            parts.append("\n" + end.group(0))
        else:  # its BEGIN line was cut off (output kept from its tail)
            start = _body_start(text, pos, mark.start())
            parts += [text[pos:start], MASK + "\n", mark.group(0)]
            end = mark
        pos = end.end()
    parts.append(text[pos:])
    return "".join(parts)


def _opening_quote(text: str, at: int, floor: int) -> str:
    """The quote just before the scheme of a URL whose ``://`` is at ``at`` (looking back no further than
    ``floor``); empty when the URL is not quoted."""
    start = at
    while start > floor and at - start < _SCHEME_MAX and text[start - 1] in _SCHEME_CHARS:
        start -= 1
    return text[start - 1] if start > floor and text[start - 1] in _CLOSING else ""


def _mask_url_passwords(text: str) -> str:
    """Every URL password masked, whatever characters it holds (``/`` of base64, ``@``, ``:``).

    A password runs from its user's ``:`` to the last ``@`` before the host, and nothing tells that ``@`` from
    one in a path: so it runs to the last ``@`` of the URL's whitespace-free token, or of its quoted string when
    a quote opens the URL. Masking too much of one token beats leaving a piece of a password. Each token is
    looked through once: linear, however many URLs one token holds."""
    parts: list[str] = []
    copied = pos = token_end = 0
    while (head := _URL_USER.search(text, pos)) is not None:
        start = head.end()
        if start > token_end:
            space = _SPACE.search(text, start)
            token_end = space.start() if space is not None else len(text)
        end = token_end
        quote = _opening_quote(text, head.start(), pos)
        if quote and (closing := _CLOSING[quote].search(text, start, token_end)) is not None:
            end = closing.start()
        at = text.rfind("@", start, end)
        if at > start:
            parts += [text[copied:start], MASK]
            copied = at
        pos = end  # no URL before ``end`` has an ``@`` after its user that is not masked now
    parts.append(text[copied:])
    return "".join(parts)


def _basic_credentials(value: str) -> bool:
    """Whether ``value`` is base64 of ``user:password`` (``Basic`` alone is a common word)."""
    try:
        decoded = base64.b64decode(value, validate=True).decode()
    except ValueError:  # binascii.Error and UnicodeDecodeError are both ValueErrors
        return False
    return ":" in decoded and decoded.isprintable()


def _credential(match: re.Match[str]) -> bool:
    """``-u user:password``, but not a numeric ``uid:gid`` (``docker run -u 1000:1000``)."""
    return not (match.group("user").isdigit() and match.group("value").isdigit())


def _secret_option(match: re.Match[str]) -> bool:
    """``--password VALUE`` for a secret name, but not the usage line's own metavar (``[--token TOKEN]``)."""
    name = match.group("name")
    metavar = match.group("value").rstrip("]),") in (name.upper().replace("-", "_"), "TEXT", "STRING", "VALUE")
    return is_secret_name(name) and not metavar


def _secret_setting(match: re.Match[str]) -> bool:
    """NCCL's ``NAME set by environment to VALUE``: masked when the name is secret-looking."""
    return is_secret_name(match.group("name"))


def _auth_scheme(match: re.Match[str]) -> bool:
    value = match.group("value")
    if match.group("bearer") is not None:
        return len(value) >= 16 and _looks_random(value)
    return _basic_credentials(value)


@dataclass(frozen=True)
class _Shape:
    """Where a command line or a header holds a secret: group ``value`` of ``pattern`` is masked when ``judge``
    agrees; ``hints`` are substrings without which ``pattern`` cannot match (most text skips it at C speed)."""

    hints: tuple[str, ...]
    pattern: re.Pattern[str]
    judge: Callable[[re.Match[str]], bool] = lambda match: True


_LOGINS = r"(?:sshpass|(?:docker|podman|nerdctl|buildah|skopeo|oras|helm(?:[ \t]+registry)?)[ \t]+login)"
_MYSQL = r"(?:mysql|mysqldump|mysqladmin|mysqlimport|mysqlcheck|mysqlshow|mariadb)"
_GAP = r"[ \t](?:[^\r\n]{0,200}?[ \t])??"  # other options before ``-p``: bounded, so linear however many per line
_SHAPES = (
    _Shape(  # curl's -u / --user / --proxy-user (-U), attached or not, the pair quoted or not
        ("-u", "-U", "--user", "--proxy-user"),
        re.compile(
            r"-(?<![\w-]-)(?:u|U|-user|-proxy-user)(?:=|[ \t]*)(?:(?P<dq>\")|(?P<sq>'))?(?P<user>[^\s:\"'()]*):"
            r"(?P<value>(?(dq)[^\"\r\n]*|(?(sq)[^'\r\n]*|\S+)))"  # to the closing quote, or the line's end
        ),
        _credential,
    ),
    _Shape(("--",), re.compile(r"--(?<![\w-]--)(?P<name>[A-Za-z][\w-]*)[ \t]+(?P<value>[^\s-]\S*)"), _secret_option),
    _Shape(("sshpass", "login"), re.compile(rf"(?<![\w-]){_LOGINS}{_GAP}-p[ \t]*(?P<value>[^\s-]\S*)")),
    _Shape(("mysql", "mariadb"), re.compile(rf"(?<![\w-]){_MYSQL}{_GAP}-p(?P<value>[^\s-]\S*)")),
    _Shape(
        ("password",),
        re.compile(r"(?<![\w-])(?:machine\s+\S+|default)(?:\s+login\s+\S+)?\s+password\s+(?P<value>\S+)"),
    ),
    _Shape(  # NCCL's log of a variable it took: the value to the line's end, less NCCL's full stop
        ("set by environment to",),
        re.compile(
            r"(?<![\w.-])(?P<name>[A-Za-z_]\w*)[ \t]+set by environment to[ \t]+"
            r"(?P<value>[^\r\n]*[^\r\n. \t])"
        ),
        _secret_setting,
    ),
    _Shape(
        ("earer", "asic"),
        re.compile(r"(?<![\w-])(?:(?P<bearer>[Bb]earer)|[Bb]asic)[ \t]+(?P<value>[A-Za-z0-9._~+/-]+=*)"),
        _auth_scheme,
    ),
)


def _mask_shape(text: str, shape: _Shape) -> str:
    def replace(match: re.Match[str]) -> str:
        whole = match.group(0)
        if not _maskable(match.group("value")) or not shape.judge(match):
            return whole
        start, end = match.start("value") - match.start(), match.end("value") - match.start()
        return whole[:start] + MASK + whole[end:]

    return shape.pattern.sub(replace, text) if any(hint in text for hint in shape.hints) else text


def mask_shapes(text: str) -> str:
    """``text`` with private-key blocks, URL passwords, well-known tokens and the secrets of command lines and
    headers masked, whatever their names."""
    if "PRIVATE KEY" in text:
        text = _mask_private_keys(text)
    if "://" in text:
        text = _mask_url_passwords(text)
    text = _TOKEN.sub(_mask_token, text)
    for shape in _SHAPES:
        text = _mask_shape(text, shape)
    return text


def mask_secrets(text: str) -> str:
    """``text`` with secrets by shape masked (:func:`mask_shapes`), and the value of every secret-looking
    ``NAME=value`` / ``NAME: value`` replaced by ``***``; masked again without what a terminal draws as nothing
    (:data:`_HIDDEN`), and kept in that plain form when that masked more."""
    masked = _mask_as_written(text)
    if _MAY_HIDE.search(masked) is None:
        return masked
    plain = _HIDDEN.sub("", masked)
    again = _mask_as_written(plain)
    return masked if again == plain else again


def _mask_as_written(text: str) -> str:
    text = mask_shapes(text)
    parts: list[str] = []
    pos = 0
    while (match := _ASSIGNMENT.search(text, pos)) is not None:
        value_start = match.end()
        parts.append(text[pos:value_start])
        pos = value_start  # not masked: the value may hold further assignments (``A=1 B_TOKEN=2``)
        if is_secret_name(match.group("name")):
            line_end = _LINE_END.search(text, value_start)
            value_end = line_end.start() if line_end is not None else len(text)
            if _maskable(text[value_start:value_end]):
                parts.append(MASK)
                pos = value_end
    parts.append(text[pos:])
    return "".join(parts)


# Past a cap, how much more of node output is masked before the cut: a secret that starts before the cut is seen
# whole (a token, a JWT, a URL's password), and the rest is never read.
CAP_MARGIN_CHARS = 64 * 1024


def masked_cap(text: str, limit: int) -> MaskedText:
    """Node output as the controller takes it in: masked, then cut to its first ``limit`` characters with a line
    saying so (:func:`keep_head`, counting the whole). Only ``limit`` and :data:`CAP_MARGIN_CHARS` more are
    masked: a node's 30 MB file costs what ``limit`` costs, before any parser sees it. Text its reader already
    cut as it arrived (:func:`~vocabulary.text.uncut`) is counted whole all the same."""
    head, total = uncut(text)
    if total <= limit:
        return MaskedText(mask_secrets(head))
    return MaskedText(keep_head(mask_secrets(head[: limit + CAP_MARGIN_CHARS]), limit, total))


def masked_head(text: str, limit: int) -> MaskedText:
    """The start of ``text`` as evidence keeps it: masked first, then cut (:func:`vocabulary.text.keep_head`). In
    that order only: a cut through a secret leaves a piece the mask no longer recognises."""
    return MaskedText(keep_head(mask_secrets(text), limit))


def masked_tail(text: str, limit: int) -> MaskedText:
    """The end of ``text`` as evidence keeps it: masked first, then cut (see :func:`masked_head`)."""
    return MaskedText(keep_tail(mask_secrets(text), limit))


def mask_value(name: str, value: str) -> str:
    """A value stored beside its name (``key``/``value`` columns): ``***`` when the name is secret-looking
    (a ``NAME=value`` line of that very name keeps its name); otherwise its secrets by shape are masked."""
    if not is_secret_name(name):
        return mask_secrets(value)
    assignment = _ASSIGNMENT.match(value)
    if assignment is not None and assignment.group("name") == name:
        return mask_secrets(value)
    return MASK if _maskable(value) else value
