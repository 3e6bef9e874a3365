"""Every packaged prompt against its paper's prompt: roles, tags, placeholders and their order.

docs/methods/<method>.md maps each instruction of the paper's prompt to the line
of our file that carries it; these tests pin what a rewording must keep.
"""

from __future__ import annotations

import pytest

from verl_evidence.prompts import (
    available_prompts,
    check_placeholders,
    load_prompt,
    placeholders,
    render_messages,
    split_roles,
)


def in_order(text: str, pieces: list[str]) -> None:
    """Each piece occurs in ``text``, each after the previous one."""
    position = 0
    for piece in pieces:
        found = text.find(piece, position)
        assert found >= 0, f"{piece!r} missing after position {position} in:\n{text}"
        position = found + len(piece)


# prompt -> (roles, placeholders, pieces in order per role)
EXPECTED: dict[str, tuple[list[str], set[str], list[list[str]]]] = {
    # EviOmni Table 14 / LEAR Table 10: one prompt; reason (question analysis, passage analysis), extract
    # (a coherent narrative, logical and concise), answer (falling back on own knowledge).
    "eviomni_reason_extract": (
        ["user"],
        {"question", "passages"},
        [
            [
                "reasoning",
                "how the passages lead to the answer",
                "<reason> and </reason>",
                "Question analysis",
                "concepts and entities",
                "relations",
                "Passage analysis",
                "one at a time",
                "sentences or phrases",
                "<extract> and </extract>",
                "coherent narrative",
                "logically",
                "concise",
                "<answer> and </answer>",
                "short answer",
                "your own knowledge",
                "Question: {question}",
                "Passages:",
                "{passages}",
            ]
        ],
    ),
    "eviomni_answer": (
        ["user"],
        {"question", "passages", "rationale", "evidence"},
        [
            [
                "placeholder",
                "<answer> and </answer>",
                "short answer",
                "own knowledge",
                "{question}",
                "{passages}",
                "{rationale}",
                "{evidence}",
            ]
        ],
    ),
    # EviOmni Algorithm 2: the extractor's question is the agent's question + thought + sub-query (Table 14 text).
    "evidence_extractor": (
        ["user"],
        {"question", "thought", "query", "passages"},
        [
            [
                "<reason> and </reason>",
                "Question analysis",
                "Passage analysis",
                "<extract> and </extract>",
                "coherent narrative",
                "<answer> and </answer>",
                "own knowledge",
                "{question}",
                "{thought}",
                "{query}",
                "{passages}",
            ]
        ],
    ),
    # GRACE Table 3: a system prompt (the role, the tags, the exact process) and a user prompt with the data.
    "grace": (
        ["system", "user"],
        {"question", "context"},
        [
            [
                "validate evidence",
                "<question> and </question>",
                "<ref> and </ref>",
                "exactly as written",
                "1.",
                "relevant to the question and useful",
                "NOT relevant",
                "<llm> and </llm>",
                "relevant",
                "<evidence> and </evidence>",
                "2.",
                "<answer> and </answer>",
            ],
            ["<question>{question}</question>", "<ref>{context}</ref>"],
        ],
    ),
    # GRACE Table 4: the baselines' three-shot demonstrations (two answerable with their gold evidence in the
    # context and answered, one without it and refused), each a user turn **Question:** / **Context:** and the
    # assistant's reply; the baselines' abstention instruction added (B.2). Then the question asked.
    "grace_three_shot": (
        ["system", "user", "assistant", "user", "assistant", "user", "assistant", "user"],
        {"question", "context"},
        [
            ["context", "I don't know."],
            ["**Question:**", "**Context:**", "Doc 1 (Title: Vltava)", "Elbe", "North Sea"],
            ["North Sea."],
            ["**Question:**", "**Context:**", "(Title: HMS Beagle)", "1820"],
            ["1820."],
            ["**Question:**", "**Context:**", "(Title: Thimphu)"],
            ["I don't know."],
            ["**Question:**", "{question}", "**Context:**", "{context}"],
        ],
    ),
    # The same three demonstrations in GRACE's own prompt (Table 3) and tags: for a baseline run with that prompt.
    "grace_three_shot_tags": (
        ["system", "user", "assistant", "user", "assistant", "user", "assistant", "user"],
        {"question", "context"},
        [
            ["validate evidence", "<llm> and </llm>", "<evidence> and </evidence>", "<answer> and </answer>"],
            ["<question>Into which sea", "<ref>Doc 1 (Title: Vltava)", "</ref>"],
            ["<evidence>", "joins the Elbe", "reaches the North Sea", "</evidence>", "<answer>North Sea</answer>"],
            ["<question>In what year", "<ref>", "</ref>"],
            ["<evidence>", "launched in 1820", "</evidence>", "<answer>1820</answer>"],
            ["<question>What is the name of the highest mountain", "<ref>", "</ref>"],
            ["<llm>", "</llm>", "<answer>I don't know</answer>"],
            ["<question>{question}</question>", "<ref>{context}</ref>"],
        ],
    ),
    # Search-R1 (the EviNote paper's base system): think, search, information, answer.
    "search_r1": (
        ["user"],
        {"question"},
        [
            [
                "<think> and </think>",
                "<search>",
                "<information> and </information>",
                "<answer> and </answer>",
                "{question}",
            ]
        ],
    ),
    # EviNote §3.1-3.2: optional notes in <summary> with * (key) and - (uncertain) marks, then <answer>.
    "evinote_sen": (
        ["user"],
        {"question"},
        [
            [
                "<think> and </think>",
                "<search>",
                "<information> and </information>",
                "may write",
                "<summary> and </summary>",
                "*asterisks*",
                "-hyphens-",
                "<answer> and </answer>",
                "{question}",
            ]
        ],
    ),
    # EviNote's ablations (Appendix A.1): NS, an optional plain summary; NE, an optional <evidence> section holding
    # only answer-relevant content; FS, a summary required after every retrieval (the reward zeroes a missing one).
    "evinote_naive_summary": (
        ["user"],
        {"question"},
        [
            [
                "<search>",
                "<information> and </information>",
                "may write",
                "<summary> and </summary>",
                "up to you",
                "<answer> and </answer>",
                "{question}",
            ]
        ],
    ),
    "evinote_naive_evidence": (
        ["user"],
        {"question"},
        [
            [
                "<search>",
                "<information> and </information>",
                "may write",
                "<evidence> and </evidence>",
                "only what is relevant",
                "<answer> and </answer>",
                "{question}",
            ]
        ],
    ),
    "evinote_force_summary": (
        ["user"],
        {"question"},
        [
            [
                "<search>",
                "<information> and </information>",
                "After every set of results you must",
                "<summary> and </summary>",
                "no reward",
                "<answer> and </answer>",
                "{question}",
            ]
        ],
    ),
    # EviPath Table 8 (planner synthesis), Table 9 (executor synthesis), Table 10 / the executor table (agent).
    "evipath_planner_synth": (
        ["user"],
        set(),
        [
            [
                "question, its correct answer, and the evidence",
                "sub-questions",
                "<think> and </think>",
                "Search(",
                "<answer>",
            ]
        ],
    ),
    # EviPath Table 8's knowledge-graph form: numbered candidate entities, Search([i], "sub-question")
    "evipath_planner_kg_synth": (
        ["user"],
        set(),
        [
            [
                "knowledge graph",
                "(subject, relation, object)",
                "sub-questions",
                "<think> and </think>",
                "candidates",
                "Candidate: [2]",
                'Search([0], "',
                "<answer>",
            ]
        ],
    ),
    "evipath_executor_synth": (
        ["user"],
        set(),
        [
            [
                "some of which is irrelevant",
                "the correct answer, and the numbers of the golden evidence",
                "<think> and </think>",
                "only from the golden evidence",
                "<select> and </select>",
                "<answer> and </answer>",
                "one complete declarative sentence",
            ]
        ],
    ),
    "evipath_planner": (
        ["user"],
        set(),
        [
            [
                "sub-questions",
                "<think> and </think>",
                'Search("a complete question")',
                "no pronouns",
                "<answer> and </answer>",
            ]
        ],
    ),
    # the fine-tuned planner of the KG form (Table 8's layout without the answer and the evidence)
    "evipath_planner_kg": (
        ["user"],
        set(),
        [
            [
                "knowledge graph",
                "sub-questions",
                "<think> and </think>",
                "numbered candidates",
                'Search([i], "a complete question")',
                "no pronouns",
                "<answer> and </answer>",
            ]
        ],
    ),
    "evipath_executor": (
        ["user"],
        set(),
        [
            [
                "unrelated",
                "<think> and </think>",
                "<select> and </select>",
                "every item that supports the answer",
                "No relevant information found.",
                "<answer> and </answer>",
                "one complete declarative sentence",
                "<think> ... </think>",
                "<select>[...]</select>",
                "<answer> ... </answer>",
            ]
        ],
    ),
    "evipath_executor_answer": (["user"], set(), [["single complete declarative sentence", "<answer> and </answer>"]]),
    "evipath_planner_search": (
        ["user"],
        {"question"},
        [["sub-questions", "<think> and </think>", "<search> and </search>", "<answer> and </answer>", "{question}"]],
    ),
    "evipath_planner_question": (["user"], {"question"}, [["Question: {question}"]]),
    # evaluation (verl_evidence/eval/paper_scoring.py): EviOmni's separate reader, GRACE's LLM judge
    "eviomni_reader": (
        ["user"],
        {"question", "document"},
        [
            [
                "answer it with the help of the documents",
                "from your own knowledge",
                "Question: {question}",
                "Document: {document}",
                "Answer:",
            ]
        ],
    ),
    # EviOmni Table 12 (closed-book QA: the Zero baseline's reader) and Table 13 (CoT generation over the passages)
    "eviomni_closed_book": (
        ["user"],
        {"question"},
        [
            [
                "[Instruction]",
                "answer it straight away",
                "short answer",
                "own knowledge",
                "Question: {question}",
                "Answer:",
            ]
        ],
    ),
    "eviomni_cot": (
        ["user"],
        {"question", "document"},
        [
            [
                "[Instruction]",
                "Read the documents",
                "answer the question",
                "Question: {question}",
                "Document: {document}",
                "step by step",
            ]
        ],
    ),
    "grace_judge": (
        ["user"],
        {"question", "gold_answers", "evidence_status", "response"},
        [
            [
                "{question}",
                "{gold_answers}",
                "{evidence_status}",
                "{response}",
                "Evidence present",
                "Evidence missing",
                "CORRECT or INCORRECT",
            ]
        ],
    ),
}


def test_every_packaged_prompt_is_checked() -> None:
    demonstrations = {name for name in available_prompts() if name.endswith("_demos")}
    assert set(available_prompts()) - demonstrations == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_prompt_roles_tags_placeholders_and_order(name: str) -> None:
    roles, fields, pieces = EXPECTED[name]
    template = load_prompt(name)
    messages = split_roles(template)
    assert [role for role, _ in messages] == roles
    assert placeholders(template) == fields
    for (_, text), expected in zip(messages, pieces, strict=True):
        in_order(text, expected)


def test_eviomni_prompts_ask_for_a_narrative_not_copied_sentences() -> None:
    """Table 14's extract step synthesises; copying sentences would change the compression ratio and o_e."""
    for name in ("eviomni_reason_extract", "evidence_extractor"):
        text = load_prompt(name).lower()
        assert "copy" not in text and "as short as possible" not in text


def test_grace_prompt_follows_the_paper_layout() -> None:
    """Table 3 asks for no <think> block; the data go in the user turn only, the process in the system turn."""
    (_, system), (_, user) = split_roles(load_prompt("grace"))
    assert "<think>" not in system + user and "Context:" not in user
    assert not placeholders(system)
    messages = render_messages(load_prompt("grace"), question="Who {wrote} it?", context="Doc 1 (Title: A) text")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[1]["content"] == (
        "The question and its references: <question>Who {wrote} it?</question> <ref>Doc 1 (Title: A) text</ref>"
    )


def test_grace_reward_accepts_the_format_the_prompt_asks_for() -> None:
    """The reward's format gate and the prompt agree: path block then answer, thinking optional (Algorithm 1)."""
    from verl_evidence.rewards import grace

    as_asked = "<evidence>The report was written by the committee.</evidence>\n<answer>the committee</answer>"
    assert grace.structure_ok(as_asked)
    assert grace.structure_ok("<think>The references are relevant.</think>\n" + as_asked)  # Qwen3 thinking mode
    assert grace.structure_ok("<llm>I recall a committee.</llm><answer>a committee</answer>")
    assert not grace.structure_ok("<answer>the committee</answer><evidence>x</evidence>")


def test_role_lines() -> None:
    template = "[[system]]\nBe brief.\n\n[[user]]\nQ: {question}\n[[assistant]]\nA.\n[[user]]\nQ2\n"
    assert split_roles(template) == [
        ("system", "Be brief."),
        ("user", "Q: {question}"),
        ("assistant", "A."),
        ("user", "Q2"),
    ]
    assert split_roles("No roles: {question}\n") == [("user", "No roles: {question}\n")]
    assert split_roles("[[system]]  \nx\n[[user]]\ny") == [("system", "x"), ("user", "y")]  # trailing blanks allowed
    assert split_roles("Text with [[user]] inside a line") == [("user", "Text with [[user]] inside a line")]
    with pytest.raises(ValueError, match="before the first role line"):
        split_roles("preamble\n[[user]]\nQ")
    with pytest.raises(ValueError, match=r"\[\[system\]\] has no text"):
        split_roles("[[system]]\n\n[[user]]\nQ")
    with pytest.raises(ValueError, match="takes one message"):
        check_placeholders(load_prompt("grace"), ["question"], name="eviomni prompt")
    check_placeholders(load_prompt("grace"), ["question", "context"], roles=True)


def test_data_preparation_writes_each_role(tmp_path) -> None:
    from verl_evidence.dataprep.records import DataPrepError
    from verl_evidence.dataprep.templates import load_template, render, render_messages

    messages = render_messages(load_template("grace"), "Who wrote it?", ["Report\nThe committee wrote it."])
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[1]["content"].endswith("<ref>Doc 1 (Title: Report) The committee wrote it.</ref>")
    assert (
        render(load_template("grace"), "Who wrote it?", ["x"])
        == render_messages(load_template("grace"), "Who wrote it?", ["x"])[1]["content"]
    )
    single = render_messages(load_template("eviomni"), "Who?", ["T\nbody"])
    assert [m["role"] for m in single] == ["user"] and not single[0]["content"].endswith("\n")
    ends_with_reply = tmp_path / "bad.txt"
    ends_with_reply.write_text("[[user]]\n{question}\n[[assistant]]\nan answer\n")
    with pytest.raises(DataPrepError, match="must end with a user message"):
        load_template(str(ends_with_reply))
    preamble = tmp_path / "preamble.txt"
    preamble.write_text("hello\n[[user]]\n{question}\n")
    with pytest.raises(DataPrepError, match="before the first role line"):
        load_template(str(preamble))
