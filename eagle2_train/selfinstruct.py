"""Self-instruct training prompts: the target writes user requests itself.

Job k is one (task type, topic, answer format, opener) draw from prompt_seeds with an RNG seeded
by (seed, k) only, so job k is the same whatever --n is. The meta-prompt (system turn, the task's
two example requests as earlier chat turns, then this job's topic/task/format) is continued from
an opener such as "Can you explain", so what comes back is a request by construction; it is then
cleaned, filtered and deduplicated (prompt_filter) against every kept prompt, the other training
files and, at a stricter threshold, the held-out prompts.

Jobs run in blocks of --batch (short and long requests as two sub-batches, each with a generator
seeded by (seed, block)); every candidate and its verdict go to OUT.log.xz (prompts_log.py),
which is the state: a rerun replays it and goes on with the next block, so stopping, resuming and
raising --n give the same file as one uninterrupted run with the same settings.
"""
from __future__ import annotations

import hashlib
import json
import random
import time
from collections import Counter
from pathlib import Path

import torch

from eagle2.errors import UserError
from .prompt_filter import clean, new_deduper, normalise, reject_reason, write_jsonl
from .prompt_seeds import DOMAIN_CATEGORY, DOMAINS, LANGUAGES, SYSTEM, TASKS
from .prompts_log import log_path, read_log, write_log

MIN_WORDS = 6  # an opener plus a few words is not yet a request


def stable_int(*parts) -> int:
    """A seed from any values that is the same in every process (Python's hash() is salted)."""
    return int.from_bytes(hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()[:8], "big")


def topic_line(task: str, topic: str, lang: str) -> str:
    if ": " in topic:  # programming topics read "Language: subject"
        lang_, subject = topic.split(": ", 1)
        return f"{subject} ({lang_})"
    return f"{topic} (into {lang})" if task == "translate" else topic


def make_job(seed: int, k: int, free: float = 0.2) -> dict:
    """Job k: task (by weight), domain, topic, format, the programming/target language and an opener
    ('' for a free start, with probability `free`)."""
    r = random.Random(stable_int("job", seed, k))
    names = sorted(TASKS)
    task = r.choices(names, weights=[TASKS[n].get("weight", 1) for n in names])[0]
    spec = TASKS[task]
    domain = r.choice(spec["domains"])
    topic = r.choice(DOMAINS[domain])
    fmt = r.choice(spec["formats"])
    lang = topic.split(": ", 1)[0] if domain == "programming" else r.choice(LANGUAGES)
    opener = "" if r.random() < free else r.choice(spec["openers"]).format(lang=lang)
    return {"k": k, "task": task, "domain": domain, "topic": topic, "format": fmt, "lang": lang, "opener": opener,
            "category": spec["cat"] or DOMAIN_CATEGORY[domain]}


def meta_messages(job: dict) -> list[dict]:
    spec = TASKS[job["task"]]

    def ask(topic: str, fmt: str, lang: str) -> str:
        return f"Topic: {topic_line(job['task'], topic, lang)}\nTask: {spec['ask']}\nFormat: {fmt}"

    msgs = [{"role": "system", "content": SYSTEM}]
    for topic, fmt, text in spec["shots"]:
        msgs += [{"role": "user", "content": ask(topic, fmt, job["lang"])}, {"role": "assistant", "content": text}]
    msgs.append({"role": "user", "content": ask(job["topic"], job["format"], job["lang"])})
    return msgs


def meta_ids(tok, job: dict) -> list[int]:
    """Token ids the target continues: the chat-formatted meta-prompt plus the opener."""
    from eagle2.model.chat import chat_ids
    msgs = meta_messages(job)
    if getattr(tok, "chat_template", None):
        ids = chat_ids(tok, msgs)
    else:  # a tokenizer without a chat template (the tests' tiny word-level one)
        ids = tok.encode("\n".join(m["content"] for m in msgs), add_special_tokens=False)
    return ids + (tok.encode(job["opener"], add_special_tokens=False) if job["opener"] else [])


def _ask_grams() -> set[tuple[str, ...]]:
    grams = set()
    for spec in TASKS.values():
        w = normalise(spec["ask"]).split()[3:]  # past "a request to" / "a question asking"
        grams |= {tuple(w[i:i + 5]) for i in range(len(w) - 4)}
    return grams


ASK_GRAMS = _ask_grams()


def echoes_meta(text: str) -> bool:
    """The model copied (part of) a task description from the meta-prompt instead of writing a request."""
    w = normalise(text).split()
    return any(tuple(w[i:i + 5]) in ASK_GRAMS for i in range(len(w) - 4))


def shot_texts() -> list[str]:
    return [t for spec in TASKS.values() for _, _, t in spec["shots"]]


def replay(log: Path, settings: dict) -> tuple[set[int], list[dict], Counter, int]:
    """Finished blocks, kept rows (in order), verdict counts and the last id given, from a previous
    run's log. The records of a block that was not finished (an interrupted run) are dropped from
    the log: that block is redone."""
    text = read_log(log)
    if text is None:
        return set(), [], Counter(), 0
    done, pending, rows, verdicts, last_id = set(), {}, [], Counter(), 0
    lines = text.split("\n")
    good = []
    for n, line in enumerate(lines[:-1]):  # a last piece without "\n" is a half-written line
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            raise UserError(f"{log}, line {n + 1}: not a prompts log record; delete the log to start over.") from None
        if n == 0:
            if rec.get("settings") != settings:
                raise UserError(f"{log} was written with other settings ({rec.get('settings')}); resume with "
                                f"those, or choose another --out.")
            good.append(line)
        elif "k" in rec:
            pending.setdefault(rec["block"], []).append((rec, line))
        else:  # a block's end marker
            done.add(rec["block"])
            for j, jline in pending.pop(rec["block"], []):
                # a prompt kept under an older, looser filter is judged again by today's
                verdict = j["verdict"] if j["verdict"] != "kept" else reject_reason(j["text"], MIN_WORDS) or "kept"
                verdicts[verdict] += 1
                if verdict == "kept":
                    rows.append({"question_id": j["id"], "category": j["category"], "turns": [j["text"]]})
                last_id = max(last_id, j.get("id", 0))
                good.append(jline)
            good.append(line)
    if len(good) != len(lines) - 1 or lines[-1]:
        write_log(log, "".join(g + "\n" for g in good))
    return done, rows, verdicts, last_id


def generate(model, tok, out: Path, n: int, seed: int = 0, batch: int = 32, temperature: float = 0.9,
             top_p: float = 0.95, first_id: int = 100001, exclude: list[str] = (), free: float = 0.2,
             max_new: tuple[int, int] = (96, 224), log=print) -> dict:
    """Run (or resume) self-instruct until jobs 0..n-1 (rounded up to whole blocks) are done; write
    the kept prompts to `out` (MT-bench jsonl) and return the counts."""
    from eagle2.cycle.sampling import SamplingParams
    from .selfdistill import batched_generate

    out = Path(out)
    log_file = log_path(out)
    settings = {"seed": seed, "batch": batch, "temperature": temperature, "top_p": top_p, "first_id": first_id,
                "free": free, "max_new": list(max_new), "exclude": [Path(p).name for p in exclude]}
    done, rows, verdicts, last_id = replay(log_file, settings)
    next_id = max(first_id, last_id + 1)  # ids stay unique when a stricter filter drops logged prompts
    dedup = new_deduper(exclude, extra_protected=shot_texts())
    for r in rows:
        dedup.add(r["turns"][0])
    logged = read_log(log_file) or ""
    if not logged:
        logged = json.dumps({"settings": settings}) + "\n"
        write_log(log_file, logged)
    eos = set(model.args.eos_ids) | ({tok.eos_token_id} if tok.eos_token_id is not None else set())
    sp = SamplingParams(temperature=temperature, top_p=top_p)
    tokens, seconds = 0, 0.0
    for b in range((n + batch - 1) // batch):
        if b in done:
            continue
        jobs = [make_job(seed, k, free) for k in range(b * batch, (b + 1) * batch)]
        texts, finished = {}, {}
        t0 = time.perf_counter()
        for long in (False, True):
            sub = [j for j in jobs if TASKS[j["task"]]["long"] == long]
            if not sub:
                continue
            gen = torch.Generator().manual_seed(stable_int("gen", seed, b, long) % 2 ** 31)
            outs = batched_generate(model, [meta_ids(tok, j) for j in sub], max_new[long], sp, gen, eos)
            for j, o in zip(sub, outs):
                finished[j["k"]] = bool(o) and o[-1] in eos
                texts[j["k"]] = j["opener"] + tok.decode(o, skip_special_tokens=True)
                tokens += len(o)
        seconds += time.perf_counter() - t0
        recs = []
        for j in jobs:
            text = clean(texts[j["k"]])
            verdict = ("truncated" if not finished[j["k"]] else
                       reject_reason(text, min_words=MIN_WORDS) or ("meta_copy" if echoes_meta(text) else None)
                       or dedup.check(text) or "kept")
            rec = {"block": b, "k": j["k"], "task": j["task"], "topic": j["topic"], "format": j["format"],
                   "opener": j["opener"], "category": j["category"], "text": text, "verdict": verdict}
            if verdict == "kept":
                dedup.add(text)
                rec["id"] = next_id
                next_id += 1
                rows.append({"question_id": rec["id"], "category": j["category"], "turns": [text]})
            verdicts[verdict] += 1
            recs.append(json.dumps(rec, ensure_ascii=False))
        recs.append(json.dumps({"block": b}))  # the block's end marker
        logged += "\n".join(recs) + "\n"
        write_log(log_file, logged)   # once a block: a block is logged whole or redone
        write_jsonl(out, rows)
        log(f"block {b}: kept {len(rows)} of {sum(verdicts.values())} so far"
            f"{f', {tokens / seconds:.1f} tok/s' if seconds else ''}")
    write_jsonl(out, rows)
    return {"generated": sum(verdicts.values()), "kept": len(rows), "verdicts": dict(verdicts),
            "categories": dict(Counter(r["category"] for r in rows)), "new_tokens": tokens,
            "tokens_per_s": tokens / seconds if seconds else 0.0}
