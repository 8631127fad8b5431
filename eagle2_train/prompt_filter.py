"""Cleaning, filtering and near-duplicate removal shared by every prompt source (self-instruct,
PyPI prompt sets), so no source lets through what another would drop.

Near-duplicates: Jaccard similarity of word 3-gram sets, computed exactly through an inverted
index (a few thousand prompts: exact is affordable and deterministic, no MinHash noise). The
held-out prompts and the web UI examples are "protected": anything close to them is dropped at
a lower threshold, so evaluation prompts never leak into training.
"""
from __future__ import annotations

import json
import re
import unicodedata
from collections import Counter
from pathlib import Path

from eagle2.errors import UserError
from eagle2.files import atomic_write
from eagle2.model.weights import ASSETS

PROMPTS = ASSETS / "prompts"
PROTECTED = (PROMPTS / "heldout.jsonl", PROMPTS / "examples.json")

_PREFIX = re.compile(r"^\s*(?:\*\*)?(?:the )?(?:user(?:'s)?(?: request| message)?|request|message|prompt|question|"
                     r"human|q)\s*(?:\*\*)?\s*[:\-]\s*(?:\*\*)?\s*", re.I)
_LIST_MARK = re.compile(r"^\s*(?:[-*\u2022]|\d{1,2}[.)])\s+")
# a line where the model starts another speaker's turn or echoes the meta-prompt: cut there
_STOP_AT = re.compile(r"\n\s*(?:\*\*)?(?:assistant|answer|response|ai|smollm|user|topic|task|format)"
                      r"\s*(?:\*\*)?\s*:", re.I)
_QUOTES = {'"': '"', "'": "'", "\u201c": "\u201d", "\u2018": "\u2019"}
_QUESTION_START = re.compile(r"^(?:what|how|why|who|whom|whose|which|when|where|can|could|would|will|is|are|am|was|"
                             r"were|have|has|had|do|does|did|should|shall|may|might)\b", re.I)

_ASSISTANT_VOICE = re.compile(r"\b(?:as an ai|language model|i'?m sorry|i am sorry|i cannot|i can'?t help|"
                              r"i'?m unable|as a helpful assistant|i'?m (?:just )?an? (?:ai|assistant))\b", re.I)
_ANSWER_START = re.compile(r"^(?:sure|certainly|of course|absolutely|great question|good question)\b|"
                           r"^here(?: is|'s| are) (?:the|your|my|some|a few) (?:answer|solution|response|list|"
                           r"summary|ideas|tips|steps|explanation|poem|story|code|translation)", re.I)
_JAILBREAK = re.compile(r"ignore (?:all |any )?(?:the |your )?(?:previous |prior )?instructions|developer mode|"
                        r"\bDAN\b|jailbreak|without (?:any )?restrictions|content polic|foul-mouthed|swears", re.I)
_FOREIGN_REPLY = re.compile(r"\b(?:respond|reply|answer|written|write)\b[^.\n]{0,40}\bin (?:chinese|japanese|"
                            r"korean|russian|arabic|hindi)\b", re.I)
_META = re.compile(r"(?:^|\n)(?:topic|task|format):|write only the message|messages that people send", re.I)
_REQUEST = re.compile(r"\b(?:can|could|would|will) you\b|\bplease\b|\bhelp me\b|\bi (?:need|want|would like|'d like)"
                      r"\b|\bhow (?:do|can|should) i\b|\bgive me\b|\bshow me\b|\btell me\b|\blet'?s\b|"
                      r"\bi'?m (?:looking|trying|struggling)\b|\bany (?:tips|ideas|advice)\b|"
                      r"^you(?: are|'re) (?:a|an|the)(?: \S+){3}", re.I)  # role-play: "You are a lighthouse keeper in..."
IMPERATIVES = set("""write explain describe compare list give create make draft compose summarize summarise translate
rewrite rephrase edit classify sort group label extract find identify solve calculate compute plan design suggest
recommend brainstorm generate help tell show imagine pretend act let's lets outline discuss convert fix debug
implement build analyse analyze evaluate name define proofread correct simplify pull predict estimate choose teach quiz
play prepare check review tl;dr turn shorten expand organize organise rank draw propose come elevate rate score spot
count pick select match complete continue finish narrate critique assess justify argue debate illustrate demonstrate
improve polish paraphrase reword condense cut shorten split tag mark determine work walk take put""".split())
_STOPWORDS = set("""the a an and or of to in on for with is are was were be been am it its this that these those my your
i you we they he she his her our their them us what how why which who when where can could would should will do does
did not no have has at by from as about into if so but please me all any some more most each every other such than
then also only just now very up out over after before there here one two first new""".split())
# a request pointing at material it does not carry ("Which of these books ...?", "Summarise the text
# below." with no text): the answer can only be made up. Looked for in the first line only.
_POINTS_AT = re.compile(r"\b(?:th(?:is|ese) (?:\w+ )?(?:text|passage|paragraph|article|code|list|table|sentences?|"
                        r"messages?|email|essay|poem|story|data|script|program|document|snippet|reviews?|notes?|letter|"
                        r"statements?|items|words|paragraphs|books|numbers|equation|quote|post)|the following"
                        r"(?: \w+)?(?=\s*(?:[:?.]|$))|the following (?:text|passage|paragraph|article|code|list|table|"
                        r"sentences?|messages?|email|essay|poem|story|data|items|words|statements)|(?:text|code|list|"
                        r"passage|paragraph|data) below|(?:text|code|passage) above|attached)\b", re.I)
_QUOTED = re.compile(r"[\"\u201c`][^\"\u201d`]{15,}[\"\u201d`]|'[^']{15,}'")
# a request that states its own answer ("What is 25% of 60? The answer is: 60."): the model wrote a
# quiz item, not a question someone would ask
_ANSWERS_ITSELF = re.compile(r"\b(?:the answer is|answer:|solution:|the correct answer)", re.I)


def missing_material(text: str) -> bool:
    """True when the first line points at a text, list or code that the request does not include:
    nothing quoted, and fewer than five words (or three code brackets) after the pointing sentence."""
    m = _POINTS_AT.search(text.split("\n", 1)[0])
    if not m or _QUOTED.search(text):
        return False
    after = text[m.end():]
    cut = re.search(r"[?:.\n]", after)
    return not (cut and len(after[cut.end():].split()) >= 5) and len(re.findall(r"[()\[\]{}=]", after)) < 3


_CONTENT = ((_JAILBREAK, "jailbreak"), (_ASSISTANT_VOICE, "assistant_voice"), (_ANSWER_START, "answer_not_request"),
            (_FOREIGN_REPLY, "foreign_reply"), (_META, "meta_copy"))


def clean(text: str) -> str:
    """Strip what a model or a corpus wraps around a request: speaker prefixes, list markers, quotes,
    a trailing second turn; normalise shouting and a missing question mark."""
    t = unicodedata.normalize("NFKC", text).replace("\r\n", "\n").strip()
    m = _STOP_AT.search(t)  # only after the first line: a leading "User:" is a prefix, stripped below
    if m:
        t = t[:m.start()].strip()
    for _ in range(3):
        t2 = _LIST_MARK.sub("", _PREFIX.sub("", t)).strip()
        if len(t2) >= 2 and t2[0] in _QUOTES and t2[-1] == _QUOTES[t2[0]] and t2[0] not in t2[1:-1]:
            t2 = t2[1:-1].strip()  # one quoted request, not a text that merely starts and ends with quotes
        if t2 == t:
            break
        t = t2
    t = "\n".join(line.rstrip() for line in t.split("\n"))
    t = re.sub(r"\n{3,}", "\n\n", t)
    letters = [c for c in t if c.isalpha()]
    if len(letters) >= 8 and all(c.isupper() for c in letters):  # SHOUTED -> Sentence case
        t = t.lower()
    if t and t[0].islower():
        t = t[0].upper() + t[1:]
    if t and _QUESTION_START.match(t) and "\n" not in t and t[-1].isalnum():
        t += "?"
    return t


def reject_reason(text: str, min_words: int = 4, max_words: int = 250, max_chars: int = 2000) -> str | None:
    """None if `text` reads as a usable English user request, else a short reason."""
    words = text.split()
    if len(words) < min_words or len(text) < 12:
        return "short"
    if len(words) > max_words or len(text) > max_chars:
        return "long"
    for pattern, reason in _CONTENT:
        if pattern.search(text):
            return reason
    letters = [c for c in text if c.isalpha()]
    if sum(c.isascii() for c in letters) < 0.9 * len(letters):
        return "not_english"
    head = text.split("\n", 1)[0].lower().split()
    if len(head) >= 6 and sum(w.strip(".,;:!?\"'") in _STOPWORDS for w in head) < 0.12 * len(head):
        return "not_english"
    lw = [w.lower() for w in words]
    grams = Counter(zip(lw, lw[1:], lw[2:], lw[3:]))
    if grams and max(grams.values()) >= 3 or (len(lw) >= 20 and len(set(lw)) < 0.35 * len(lw)):
        return "repetitive"
    if missing_material(text):
        return "missing_material"
    if _ANSWERS_ITSELF.search(text):
        return "answers_itself"
    # the verb may open the text or follow a short lead-in ("From the text below, list ...")
    lead = {w.strip(",:;") for w in head[:1] + [head[i + 1] for i, w in enumerate(head[:8])
                                                 if w.endswith(",") and i + 1 < len(head)]}
    if not ("?" in text or lead & IMPERATIVES or _REQUEST.search(" ".join(words[:20]))):
        return "not_a_request"
    return None


def normalise(text: str) -> str:
    t = unicodedata.normalize("NFKC", text).lower()
    return " ".join(re.sub(r"[^\w]+", " ", t).split())


def shingles(text: str, n: int = 3) -> set[tuple[str, ...]]:
    w = normalise(text).split()
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)} if len(w) >= n else {tuple(w)}


class Deduper:
    """Exact (normalised) and near-duplicate detection against everything added so far."""

    def __init__(self, threshold: float = 0.6, protected_threshold: float = 0.45):
        self.threshold, self.protected_threshold = threshold, protected_threshold
        self.exact: dict[str, bool] = {}
        self.index: dict[tuple, list[int]] = {}
        self.sizes: list[int] = []
        self.protected: list[bool] = []

    def check(self, text: str) -> str | None:
        norm = normalise(text)
        if norm in self.exact:
            return "heldout_copy" if self.exact[norm] else "duplicate"
        sh = shingles(text)
        hits = Counter(i for s in sh for i in self.index.get(s, ()))
        for i, c in hits.items():
            j = c / (len(sh) + self.sizes[i] - c)
            if self.protected[i] and j >= self.protected_threshold:
                return "near_heldout"
            if j >= self.threshold:
                return "near_duplicate"
        return None

    def add(self, text: str, protected: bool = False) -> None:
        norm = normalise(text)
        self.exact[norm] = self.exact.get(norm, False) or protected
        sh = shingles(text)
        for s in sh:
            self.index.setdefault(s, []).append(len(self.sizes))
        self.sizes.append(len(sh))
        self.protected.append(protected)


def reference_texts(path: Path) -> list[str]:
    """Every user turn of a prompt file: MT-bench jsonl, or examples.json (category -> prompts)."""
    path = Path(path)
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as e:
        raise UserError(f"Cannot read prompt file {path}: {e.strerror}.") from None
    if path.suffix == ".json":
        try:
            data = json.loads(raw)
            return [t for v in data.values() for t in v]
        except (json.JSONDecodeError, AttributeError, TypeError):
            raise UserError(f"{path}: expected a JSON object of category -> list of prompts.") from None
    from eagle2.tools.prompt_files import read_prompts
    return [t for q in read_prompts(path) for t in q["turns"]] if raw.strip() else []


def reference_ids(paths) -> set[int]:
    from eagle2.tools.prompt_files import read_prompts
    return {q["question_id"] for p in paths if Path(p).suffix == ".jsonl" and Path(p).read_text().strip()
            for q in read_prompts(Path(p))}


def new_deduper(exclude=(), protected=PROTECTED, extra_protected=()) -> Deduper:
    """A Deduper that already holds the excluded training prompts and the protected evaluation ones."""
    d = Deduper()
    for p in protected:
        for t in reference_texts(p):
            d.add(t, protected=True)
    for t in extra_protected:
        d.add(t, protected=True)
    for p in exclude:
        for t in reference_texts(p):
            d.add(t)
    return d


def write_jsonl(path: Path, rows: list[dict]) -> None:
    """Replace `path` atomically (a crash never leaves half a file)."""
    atomic_write(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
