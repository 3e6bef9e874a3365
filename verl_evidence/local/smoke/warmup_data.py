"""The warm-up examples: each family's output format, built from the bundled questions' gold answers and evidence.

A family is the recipes that share a prompt format (and so a warmed-up policy):
``eviomni`` (EviOmni, LEAR), ``search`` (EviNote, Search-R1, composite), ``grace``;
``search_neutral`` is a variant of ``search`` (notes on half the questions), ``search_both_ways`` another (each
question with a note and without), ``grace_neutral`` of ``grace`` (each question's reply in either path's tags),
``grace_judged`` another (the same, after a judgement of the context in a think block).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Mapping
from pathlib import Path

from verl_evidence.local.smoke.data import method_data, read_rows
from verl_evidence.local.smoke.settings import (
    FAMILIES,
    SMOKE_MAX_OBS_TOKENS,
    WARMUP_ROWS_PER_FORMAT,
    WARMUP_STEPS,
    locked,
    smoke_dir,
    smoke_method,
    warmup_cache_name,
    warmup_family,
)


def _first(values, default: str = "") -> str:
    values = list(values or [])
    return str(values[0]) if values else default


def _warmup_examples(
    rows: list[dict], target: Callable[[dict], list[dict] | None], count: int, seed: int
) -> list[dict]:
    """Chat examples: the row's prompt and an assistant reply (a message, or ``segments`` of one turn)."""
    examples = []
    for row in random.Random(seed).sample(rows, len(rows)):
        reply = target(row)
        question = row["extra_info"]["question"]
        if reply and "role" in reply[0]:
            examples.append({"messages": list(row["prompt"]) + reply, "question": question})
        elif reply:
            text = "".join(segment["text"] for segment in reply)
            messages = list(row["prompt"]) + [{"role": "assistant", "content": text}]
            examples.append({"messages": messages, "segments": reply, "question": question})
        if len(examples) == count:
            break
    return examples


def _short(text: str, words: int = 8) -> str:
    # Short spans: the warm-up teaches the format; copying long spans is what RL is for.
    return " ".join(text.split()[:words])


def _noted(example: dict) -> bool:
    """Whether a search example's final reply writes a note."""
    return "<summary>" in example["messages"][-1]["content"]


def _eviomni_target(row: dict) -> list[dict] | None:
    truth = row["reward_model"]["ground_truth"]
    evidence, answer = _first(truth.get("evidence")), _first(truth.get("target"))
    if not evidence or not answer:
        return None
    reply = f"<reason>One passage answers it.</reason><extract>{_short(evidence)}</extract><answer>{answer}</answer>"
    return [{"role": "assistant", "content": reply}]


def _eviomni_masked_answers(rows: list[dict], count: int) -> list[dict]:
    """The o_r / o_e prompts (knowledge-masked inputs) the EviOmni loop asks the same policy to answer."""
    from verl_evidence.prompts import load_prompt, render_prompt
    from verl_evidence.tools.documents import format_documents

    template = load_prompt("eviomni_answer")
    examples = []
    for index, row in enumerate(rows[:count]):
        truth = row["reward_model"]["ground_truth"]
        evidence, answer = _first(truth.get("evidence")), _first(truth.get("target"))
        passages = format_documents([{"document": p} for p in row["extra_info"].get("passages") or []])
        masked = "[hidden]"
        fields = {
            "question": row["extra_info"]["question"],
            "passages": passages,
            "rationale": "One passage answers it.",
            "evidence": _short(evidence),
        }
        fields["evidence" if index % 2 else "passages"] = masked
        if index % 2 == 0:
            fields["rationale"] = masked
        prompt = render_prompt(template, **fields)
        reply = {"role": "assistant", "content": f"<answer>{answer}</answer>"}
        examples.append({"messages": [{"role": "user", "content": prompt}, reply]})
    return examples


def _search_target(
    with_note: bool, tokenizer, quote_opening: bool = False, answers: Mapping[str, str] | None = None
) -> Callable[[dict], list[dict] | None]:
    """One search, its observation, (a note,) the answer: laid out token for token as the search loop builds it.

    The note quotes the evidence's first words, or with ``quote_opening`` the first words of the passage's text
    (right after its title in the observation): text the policy sees whichever passage its search returns.
    ``answers``: the answer each question is given instead of its gold one.

    The policy's turns are encoded on their own and the context between them is the
    loop's own pieces (``INFORMATION_OPEN``, the document tokens cut at the smoke
    run's ``max_obs_tokens``, ``INFORMATION_CLOSE``, the final-turn notice), so the
    tiny policy sees at warm-up exactly the token sequence it continues at rollout.
    Context pieces carry no loss (``trained: False``), as they carry no loss in RL.
    """
    from verl_evidence.agent_loops.common import encode
    from verl_evidence.agent_loops.search_loop_settings import INFORMATION_CLOSE, INFORMATION_OPEN, SearchLoopSettings
    from verl_evidence.bundled import load_corpus
    from verl_evidence.tools.documents import format_documents, split_contents

    corpus = {doc["id"]: doc["contents"] for doc in load_corpus()}
    notice = SearchLoopSettings().final_turn_notice  # the smoke run allows one search: its answer turn is the last

    def target(row: dict) -> list[dict] | None:
        truth = row["reward_model"]["ground_truth"]
        evidence, answer = _first(truth.get("evidence")), _first(truth.get("target"))
        question = row["extra_info"]["question"]
        if answers is not None:
            answer = answers.get(question, "")
        passage = next((text for text in corpus.values() if evidence and evidence in text), None)
        if not answer or passage is None:
            return None
        documents = encode(tokenizer, format_documents([{"document": {"id": "d", "contents": passage}}]))
        observation = tokenizer.decode(documents[:SMOKE_MAX_OBS_TOKENS])
        quoted = _short(split_contents(passage)[1], 5) if quote_opening else _short(evidence, 6)
        note = f"<summary>*{quoted}*</summary>\n" if with_note else ""
        return [
            {"text": f"<search>{_short(question, 6)}</search>", "trained": True},
            {"text": INFORMATION_OPEN, "trained": False},
            {"text": observation, "trained": False, "ids": documents[:SMOKE_MAX_OBS_TOKENS]},
            {"text": INFORMATION_CLOSE, "trained": False},
            {"text": notice, "trained": False},
            {"text": f"{note}<answer>{answer}</answer>", "trained": True},
        ]

    return target


def _grace_parts(row: dict) -> tuple[str, str, str] | None:
    """The right path's tag (evidence when the context answers the question, llm when not), its text, the answer."""
    truth = row["reward_model"]["ground_truth"]
    answer = _first(truth.get("target"))
    if not answer:
        return None
    if truth.get("answerable"):
        evidence = _first(truth.get("evidence"))
        return ("evidence", _short(evidence), answer) if evidence else None
    return "llm", "I recall it.", answer


# The judgement a ``grace_judged`` reply opens with: the first step of GRACE's procedure (are the references relevant?)
# written out in a think block, which GRACE's reward skips (it scores the text after the last ``</think>``).
GRACE_JUDGEMENTS = {True: "The references are relevant.", False: "The references are not relevant."}


def _grace_reply(path: str, text: str, answer: str, judgement: str | None = None) -> list[dict]:
    thought = f"<think>{judgement}</think>\n" if judgement else ""
    return [{"role": "assistant", "content": f"{thought}<{path}>{text}</{path}>\n<answer>{answer}</answer>"}]


def _grace_target(row: dict) -> list[dict] | None:
    parts = _grace_parts(row)
    return _grace_reply(*parts) if parts else None


def _grace_examples(rows: list[dict]) -> list[dict]:
    """GRACE's warm-up questions: half answerable, half not, each with the right path's reply."""
    examples = []
    for answerable in (True, False):
        subset = [r for r in rows if bool(r["reward_model"]["ground_truth"].get("answerable")) == answerable]
        examples += _warmup_examples(subset, _grace_target, WARMUP_ROWS_PER_FORMAT // 2, seed=4 + answerable)
    return examples


def warmup_examples(family: str, tokenizer_dir: Path) -> list[dict]:
    """Chat examples (``messages``) in the output format of one family of recipes."""
    n = WARMUP_ROWS_PER_FORMAT
    if family == "eviomni":
        rows = read_rows(method_data("eviomni", tokenizer_dir))
        # Mostly the trained (r, e, o_f) format; a few knowledge-masked answer prompts (o_r, o_e) so those answers
        # keep their tags, but not so many that "</answer>" crowds out "</reason>" in a model this small.
        return _warmup_examples(rows, _eviomni_target, n, seed=1) + _eviomni_masked_answers(rows, 2)
    if family == "search":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        evinote = read_rows(method_data("evinote", tokenizer_dir))
        with_note = _warmup_examples(evinote, _search_target(True, tokenizer), n, seed=2)
        # Search-R1's prompt with the same questions, without notes: its exact-match reward then has answers to find.
        questions = {e["question"] for e in with_note}
        search_r1_rows = read_rows(method_data("search_r1", tokenizer_dir))
        search_r1 = [r for r in search_r1_rows if r["extra_info"]["question"] in questions]
        return with_note + _warmup_examples(search_r1, _search_target(False, tokenizer), n // 4, seed=3)
    if family == "search_neutral":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        evinote = read_rows(method_data("evinote", tokenizer_dir))
        # Notes on half the questions, always; the other half answered straight after the observation. The note
        # quotes the opening words of the passage the search returned, so it is well formed whichever passage a
        # rollout's search finds. Measured (each question's final turn sampled 8 times at temperature 1 in its
        # warm-up context, 1600 steps): a well-formed note in 26 of 64 samples, the answer right in 47 of 64. Tried
        # and dropped (800 steps): each question once with a note and once without (the policy mixes the two
        # replies: at most 1 of 64 paid, either quote, with or without the replies differing from the first token;
        # notes on half the questions quoting the gold evidence: 3 of 64; quoting the passage's opening: 6 of 64).
        with_note = _warmup_examples(evinote, _search_target(True, tokenizer, quote_opening=True), n, seed=2)
        without_note = _warmup_examples(evinote, _search_target(False, tokenizer), n, seed=2)
        return with_note[::2] + without_note[1::2]
    if family == "search_both_ways":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        evinote = read_rows(method_data("evinote", tokenizer_dir))
        # search_neutral's examples, but every question both ways: a note quoting the passage's opening, and none.
        # For the corpus-trained tokenizer, whose policy keeps a question's two replies apart where the byte-like
        # one's mixes them. Measured there (each question's final turn sampled 8 times at temperature 1 in its
        # warm-up context): 800 steps, both replies in 8 of 8 questions' samples, a note in 0.61 and EviNote's gate
        # paid in 0.59 of 64; search_neutral's design, 400 steps: 0 of 8 questions with both (each question's reply
        # learnt by heart, noted or not), at 1600 steps the benchmark's EviNote reward stood still for 20 steps.
        with_note = _warmup_examples(evinote, _search_target(True, tokenizer, quote_opening=True), n, seed=2)
        return with_note + _warmup_examples(evinote, _search_target(False, tokenizer), n, seed=2)
    if family == "search_both_answers":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        evinote = read_rows(method_data("evinote", tokenizer_dir))
        # search_both_ways' examples, and each of them again with another warm-up question's answer: the policy
        # then answers a question right in some samples and wrong in others, so exact match has a spread within a
        # group (on search_both_ways each question's answer is learnt by heart: right in every sample or in none,
        # and Search-R1's reward had nothing to move in 0.92 of the groups). Measured (each question's final turn
        # sampled 16 times at temperature 1 in its warm-up context, 2400 steps): right in 0.47 of 128 samples, a note
        # in 0.29, EviNote's gate paid in 0.27; all 8 questions' samples both right and wrong, noted and not.
        both_ways = warmup_examples("search_both_ways", tokenizer_dir)
        questions = list(dict.fromkeys(example["question"] for example in both_ways))
        gold = {r["extra_info"]["question"]: _first(r["reward_model"]["ground_truth"].get("target")) for r in evinote}
        wrong = {question: gold[questions[(i + 1) % len(questions)]] for i, question in enumerate(questions)}
        chosen = [r for r in evinote if r["extra_info"]["question"] in wrong]
        wrong_answered = [
            example
            for with_note in (True, False)
            for example in _warmup_examples(
                chosen, _search_target(with_note, tokenizer, quote_opening=with_note, answers=wrong), n, seed=2
            )
        ]
        return both_ways + wrong_answered
    if family == "search_mostly_noted":
        # search_both_answers with each noted example twice (32 of 48 examples noted), so EviNote's reward, which
        # pays only a well-formed note, fires in most samples at step 1 and not in all: on search_both_answers it
        # paid in 0.18-0.28 of the benchmark's step-1 samples (24 runs, mean 0.24), under the 0.2 a reward needs to
        # be seen moving. Measured as search_both_answers (16 samples per question, 2400 steps): a note in 0.66,
        # EviNote paid 0.66, right in 0.47; all 8 questions noted and not, paid and not; 7 of 8 right and wrong.
        both_answers = warmup_examples("search_both_answers", tokenizer_dir)
        return both_answers + [example for example in both_answers if _noted(example)]
    if family == "grace":
        return _grace_examples(read_rows(method_data("grace", tokenizer_dir)))
    if family in ("grace_neutral", "grace_judged"):
        # GRACE's questions, each twice: its reply once in the right path's tags and once in the other path's, the
        # text inside the same (a quote on an answerable context, "I recall it." on an unanswerable one), so each
        # question's samples take either path about half the time and GRACE's path term (wrong: format only, 0.5;
        # right: 1.5, or up to 6.5 with the quote's and answer's ROUGE-L) has a spread to move within every group.
        # Measured: each question's prompt sampled 8 times at temperature 1 by the warmed-up policy (64 samples;
        # benchmarks/learning.py warmup_path_rate): samples on the right path / with a valid structure, questions
        # whose 8 samples take both paths / differ in score.
        #   this warm-up, 500 / 1000 / 1600 / 2400 / 3200 steps: right 17/22, 11/28, 17/31, 16/30, 17/28;
        #     both paths 1, 3, 7, 7, 5 of 8; a score spread 7, 7, 8, 8, 8 of 8   -> 1600 (settings.WARMUP_STEPS)
        #   one reply per question, the wrong path on every other one of each class, 300 / 500 / 800 / 1200 steps:
        #     right 7/19, 14/27, 30/62, 31/63; both paths in 0 questions (each question's path learnt by heart)
        #   each question both ways, each path with its own text (the quote, or "I recall it."), 500 / 1000 / 1600:
        #     right 7/24, 14/37, 21/38; both paths in 0 questions (the texts mixed: no valid evidence-path sample)
        # grace_judged: the same, each reply opening with the context's judgement (GRACE_JUDGEMENTS), right for its
        # context and the same whichever path follows. On grace_neutral the policy decides the path at the reply's
        # second token, before anything it wrote depends on the context, and whether 20 steps taught it the condition
        # depended on the machine the warm-up ran on (learnt in 6 of 6 seeds on one machine's warm-up, 0 of 7 on
        # another's: docs/learning-benchmark.md). Here the path follows a judgement the warm-up already taught, so
        # what the reward has to teach is the path's link to it, GRACE's gate, in either sign.
        rows = read_rows(method_data("grace", tokenizer_dir))
        by_question = {r["extra_info"]["question"]: r for r in rows}
        examples = []
        for example in _grace_examples(rows):
            row = by_question[example["question"]]
            right, text, answer = _grace_parts(row)
            judgement = GRACE_JUDGEMENTS[right == "evidence"] if family == "grace_judged" else None
            for path in (right, "llm" if right == "evidence" else "evidence"):
                examples.append(
                    {
                        "messages": list(row["prompt"]) + _grace_reply(path, text, answer, judgement),
                        "question": example["question"],
                    }
                )
        return examples
    raise ValueError(f"unknown warm-up family {family!r}")


def warmup_data(tokenizer_dir: Path) -> Path:
    """Every family's examples as chat-format parquet (``messages``): the data of the evipath_sft smoke run."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = smoke_dir() / "data" / "warmup.parquet"
    if out.exists():
        return out
    examples = [
        {"messages": e["messages"]}  # verl's SFT data: chat messages only
        for family in sorted(FAMILIES)
        for e in warmup_examples(family, tokenizer_dir)
    ]
    pq.write_table(pa.Table.from_pylist(examples), out.with_suffix(".tmp.parquet"))
    out.with_suffix(".tmp.parquet").replace(out)
    return out


def warmed_up_rows(method: str, tokenizer_dir: Path, warmup: str | None = None) -> Path:
    """``method``'s prepared rows restricted to the questions its family (or the ``warmup`` variant of it) was
    warmed up on (cached).

    A 2-layer policy learns the format on the prompts it saw: sampled at temperature
    1, the EviOmni policy closed reason/extract/answer in 13 of 48 samples on its
    warm-up questions and in 1 of 48 on other questions (measured). The search
    recipes' rewards also turn on the exact answer (Search-R1's EM, EviNote's gate),
    which such a policy only knows by heart. Training on those questions is what gives
    every smoke run's GRPO groups a spread at step 2.
    """
    spec = smoke_method(method)
    family = warmup_family(method, warmup)
    # the recipes' own warm-ups keep their cache names; a variant's carry its data version
    suffix = "" if family == spec.family else f"-{warmup_cache_name(family)}"
    out = smoke_dir() / "data" / f"{method}{suffix}-warmed.parquet"
    if out.exists():
        return out
    import pyarrow as pa
    import pyarrow.parquet as pq

    questions = {e["question"] for e in warmup_examples(family, tokenizer_dir) if "question" in e}
    kept = [r for r in read_rows(method_data(spec.data, tokenizer_dir)) if r["extra_info"]["question"] in questions]
    tmp = out.with_suffix(".tmp.parquet")
    pq.write_table(pa.Table.from_pylist(kept), tmp)
    tmp.replace(out)
    return out


def question_hash(question: str) -> str:
    """A fixed order of the bundled questions, independent of the machine and of Python's hash seed."""
    return hashlib.sha256(question.strip().encode("utf-8")).hexdigest()


def heldout_split(rows: list[dict], seen_texts: list[str], count: int, balance_key: str | None = None) -> list[dict]:
    """Up to ``count`` rows whose question occurs in none of ``seen_texts``, first by :func:`question_hash`.

    ``seen_texts``: everything a policy trained on (the warm-up examples' messages); a question found in any of
    them is not held out, whichever prompt it came in. ``balance_key``: a ground-truth field (GRACE's
    ``answerable``) whose values share the rows equally. One row per question.
    """
    seen = "\n".join(seen_texts)
    candidates: dict[str, dict] = {}
    for row in sorted(rows, key=lambda r: question_hash(r["extra_info"]["question"])):
        question = row["extra_info"]["question"]
        if question not in candidates and question not in seen:
            candidates[question] = row
    if balance_key is None:
        return list(candidates.values())[:count]
    groups: dict[str, list[dict]] = {}
    for row in candidates.values():
        groups.setdefault(str(row["reward_model"]["ground_truth"].get(balance_key)), []).append(row)
    per_group = count // max(1, len(groups))
    chosen = [row for key in sorted(groups) for row in groups[key][:per_group]]
    return sorted(chosen, key=lambda r: question_hash(r["extra_info"]["question"]))


def trained_texts(tokenizer_dir: Path) -> list[str]:
    """The text of every warm-up example of every family: what no held-out question may appear in."""
    return [
        "\n".join(str(message.get("content", "")) for message in example["messages"])
        for family in sorted(WARMUP_STEPS)
        for example in warmup_examples(family, tokenizer_dir)
    ]


def heldout_rows(method: str, tokenizer_dir: Path, count: int) -> Path:
    """``count`` of ``method``'s prepared rows on questions no warm-up (of any family) and so no smoke run trained
    on, chosen by a fixed hash of the question (cached). GRACE's are half answerable, half not.

    The tiny policy knows answers only by heart, so on these questions its exact match and F1 stay near 0;
    what can carry over is behaviour: the format, notes, evidence length, the evidence-or-recall choice.
    """
    spec = smoke_method(method)
    if spec.data is None:
        raise ValueError(f"{method} trains on the warm-up data itself: it has no held-out rows")
    out = smoke_dir() / "data" / f"{method}-heldout{count}.parquet"
    if out.exists():
        return out
    import pyarrow as pa
    import pyarrow.parquet as pq

    with locked(out):  # one writer of the temporary file, whichever thread or process asks first
        if out.exists():
            return out
        rows = read_rows(method_data(spec.data, tokenizer_dir))
        balance = "answerable" if spec.data == "grace" else None
        kept = heldout_split(rows, trained_texts(tokenizer_dir), count, balance_key=balance)
        tmp = out.with_suffix(".tmp.parquet")
        pq.write_table(pa.Table.from_pylist(kept), tmp)
        tmp.replace(out)
    return out
