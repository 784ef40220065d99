"""The interview question bank: complete in both languages, every evidence reference resolves, every quoted
number matches its evidence; the validator rejects broken entries; the quiz works without a browser."""

from __future__ import annotations

import copy
import json
import re
import statistics
from pathlib import Path

import nbformat
import pytest

from flashcourse import interview
from flashcourse.interview import bank as bank_module
from flashcourse.interview import evidence, zh_style
from flashcourse.interview.quiz import Quiz, markdown_to_html

BANK = interview.load()

# The required topics and myths, each mapped to the entry that answers it.
REQUIRED = {
    "why FlashAttention is fast": "why-fast",
    "faster despite more FLOPs": "more-flops-yet-faster",
    "online softmax stability": "online-softmax-stability",
    "what is stored for the backward, why recomputation pays": "backward-recomputation",
    "memory saved without recomputation": "memory-saved",
    "block sizes and their limits": "block-sizes",
    "tiling at N = 64K": "long-sequences",
    "FA2 over FA1": "fa2-changes",
    "FA3 on Hopper": "fa3-hopper",
    "inference and decoding": "decoding",
    "tensor and sequence parallelism": "parallelism",
    "limits": "limits",
    "vs xformers": "vs-xformers",
    "vs sparse attention": "vs-sparse",
    "vs linear attention": "vs-linear",
    "myth: traffic O(N^2) to O(N)": "myth-io-linear",
    "myth: 20 MB of SRAM": "myth-sram-20mb",
    "myth: FA2 calls cuBLAS": "myth-cublas",
    "myth: no masks or dropout": "myth-no-masks",
    "myth: approximate or sparse": "myth-approximate",
    "myth: only for training": "myth-training-only",
    "myth: merging costs 20-30%": "myth-rescale-cost",
    "myth: O(N^2) memory without recomputation": "myth-memory-without-recompute",
    # serving and 2025 models
    "continuous batching, iteration-level scheduling (Orca)": "continuous-batching",
    "TTFT, TPOT and goodput": "ttft-tpot",
    "prefill-decode disaggregation (DistServe, Mooncake)": "pd-disaggregation",
    "speculative decoding: why lossless, acceptance rate": "speculative-decoding",
    "tree attention and tree masks (SpecInfer, Medusa, EAGLE)": "tree-attention",
    "KV-cache quantisation (FP8 scales, KIVI)": "kv-cache-quantization",
    "MLA absorbed in decode, not prefill; TP vs DP attention": "mla-absorb-parallel",
    "trainable sparse attention (NSA, DSA, MoBA)": "trainable-sparse-attention",
    "linear and hybrid attention (Gated DeltaNet, lightning, Kimi Linear)": "linear-hybrid",
    "attention sinks (StreamingLLM, gpt-oss)": "attention-sinks",
    "batch invariance and determinism": "batch-invariance",
    "cascade / shared-prefix kernels": "cascade-attention",
    "FA3's setmaxnreg": "fa3-setmaxnreg",
    "FA3's FP8 V transpose": "fa3-fp8-v-transpose",
    "judging a decode kernel": "decode-benchmark",
}
STANDARD_TERMS = ("IO 感知", "分块", "重计算", "online softmax", "rescale", "running max", "算子融合")


def _texts(entry):
    """Every bilingual text field of an entry, with where it sits."""
    yield "question", entry["question"]
    yield "short", entry["short"]
    yield "long", entry["long"]
    for i, follow in enumerate(entry["follow_ups"]):
        yield f"follow_ups[{i}].question", follow["question"]
        yield f"follow_ups[{i}].answer", follow["answer"]
    for i, wrong in enumerate(entry["wrong_answers"]):
        yield f"wrong_answers[{i}].claim", wrong["claim"]
        yield f"wrong_answers[{i}].correction", wrong["correction"]


# ------------------------------------------------------------------------------------------- the bank
def test_the_shipped_bank_is_valid():
    """Every evidence reference resolves and every quoted number matches what its evidence holds."""
    assert interview.validate(BANK) == []


def test_covers_every_required_topic_and_myth():
    ids = {entry["id"] for entry in BANK.entries}
    assert len(BANK.entries) >= 60
    missing = {topic: entry_id for topic, entry_id in REQUIRED.items() if entry_id not in ids}
    assert not missing, f"the bank lacks entries for {missing}"
    assert {e["id"] for e in BANK.in_section("myths")} >= {v for k, v in REQUIRED.items() if k.startswith("myth")}


@pytest.mark.parametrize("entry", BANK.entries, ids=lambda e: e["id"])
def test_every_field_in_both_languages(entry):
    assert entry["follow_ups"] and entry["wrong_answers"] and entry["evidence"]
    for where, field in _texts(entry):
        assert set(field) == {"en", "zh"}, f"{entry['id']} {where}: languages {sorted(field)}"
        en, zh = field["en"].strip(), field["zh"].strip()
        assert en and zh, f"{entry['id']} {where}: empty text"
        assert zh != en, f"{entry['id']} {where}: the Chinese text is the English text"
        assert bank_module.CJK.search(zh), f"{entry['id']} {where}: no Chinese characters in {zh!r}"


@pytest.mark.parametrize("entry", BANK.entries, ids=lambda e: e["id"])
def test_every_evidence_item_resolves(entry):
    for item in entry["evidence"]:
        value = bank_module.evidence_value(item)
        if "quote" in item:
            assert evidence.quote_matches(str(item["quote"]), value), (entry["id"], item, value)


def test_uses_the_standard_chinese_terms():
    chinese = " ".join(field["zh"] for entry in BANK.entries for _, field in _texts(entry))
    assert [term for term in STANDARD_TERMS if term not in chinese] == []


ROOT = Path(__file__).resolve().parents[1]


def test_chinese_is_written_as_the_community_writes_it():
    """No rendering the glossary avoids (内核, 线程束, 张量核心, 词元, 程序实例, ...), no stray spaces at full-width
    punctuation, no "少 X 倍" or "X 倍（Xx）", full-width colons in bold headings, Chinese quotation marks, at most
    one full-width colon in a field of the bank."""
    found = [p for entry in BANK.entries for where, field in _texts(entry)
             for p in zh_style.field_problems(field["zh"], f"{entry['id']} {where}")]
    found += [p for section, title in BANK.sections.items() for p in zh_style.field_problems(title["zh"], section)]
    found += zh_style.problems(interview.render_markdown(BANK, "zh"), "rendered bank")
    lesson = nbformat.read(ROOT / "notebooks" / "10_interview_walkthrough_zh.ipynb", as_version=4)
    for index, cell in enumerate(lesson.cells):
        if cell.cell_type == "markdown":
            found += zh_style.problems(cell.source, f"lesson 10 (zh) cell {index}")
    assert found == []


def test_the_style_check_catches_each_rule():
    bad = ('这个内核用张量核心，词元很多， `x` 少 5.6 倍，快 7.6 倍（7.6x）。**30 秒回答.** 他说"很快"。')
    problems = "\n".join(zh_style.problems(bad))
    for expected in ("内核", "张量核心", "词元", "a space after full-width punctuation", "少 X 倍", "written twice",
                     "bold heading", "quotation marks"):
        assert expected in problems, expected
    assert "does not render" in "\n".join(zh_style.problems("**30 秒回答：**attention"))
    assert zh_style.problems("速度是 FA2 的 1.5-2.0 倍，`a ，b` 里的空格不算。<strong>30 秒回答：</strong>attention，"
                             "点击 **显示答案**。**追问** 会给出追问。") == []


def test_glossary_lists_every_avoided_rendering():
    glossary = (ROOT / "docs" / "glossary.md").read_text()
    assert [term for term in zh_style.AVOID if term not in glossary] == []


def test_quoted_numbers_are_stated_in_both_languages():
    entry = BANK.entry("fa3-hopper")
    for lang in interview.LANGUAGES:
        stated = interview.numbers_in(entry["short"][lang])
        assert {"740", "75", "1.5", "2.0"} <= set(stated), (lang, stated)


# ------------------------------------------------------------------------------------------- the validator
def _bank_with(entry) -> interview.Bank:
    return interview.Bank(sections=BANK.sections, entries=[entry])


def _entry(entry_id="why-fast"):
    return copy.deepcopy(BANK.entry(entry_id))


def test_validator_rejects_a_quote_its_evidence_does_not_hold():
    entry = _entry()
    item = next(i for i in entry["evidence"] if i.get("compute") == "io_traffic_ratio")
    item["quote"] = "9.5"
    for lang in interview.LANGUAGES:
        entry["long"][lang] = entry["long"][lang].replace("5.6", "9.5")
    problems = interview.validate(_bank_with(entry))
    assert any("quotes 9.5 but the evidence holds 5.62963" in p for p in problems), problems


def test_validator_rejects_a_number_no_evidence_quotes():
    entry = _entry()
    entry["short"]["en"] += " It is 3.14x faster."
    problems = interview.validate(_bank_with(entry))
    assert problems == ["entry why-fast (en): states 3.14 but no evidence of the entry quotes it"]


def test_validator_rejects_a_quote_missing_from_one_language():
    entry = _entry()
    entry["long"]["zh"] = entry["long"]["zh"].replace("5.6 倍", "若干倍")
    for wrong in entry["wrong_answers"]:
        wrong["correction"]["zh"] = wrong["correction"]["zh"].replace("5.6 倍", "若干倍")
    problems = interview.validate(_bank_with(entry))
    assert problems == ["entry why-fast (zh): evidence quotes 5.6 but the zh answer never states it"]


def test_validator_wants_three_to_five_bilingual_points():
    entry = _entry()
    assert 3 <= len(entry["points"]) <= 5
    entry["points"] = entry["points"][:2]
    assert "points must list the 3 to 5 points" in "\n".join(interview.validate(_bank_with(entry)))
    entry = _entry()
    del entry["points"]
    assert "points must list" in "\n".join(interview.validate(_bank_with(entry)))
    entry = _entry()
    entry["points"][1] = {"en": "Tiles in SRAM.", "zh": "Tiles in SRAM."}
    entry["points"][2]["en"] += " It saves 42% of the traffic."
    problems = "\n".join(interview.validate(_bank_with(entry)))
    assert "points[1]: the zh text is the en text" in problems
    assert "states 42 but no evidence of the entry quotes it" in problems  # points state numbers like answers


def test_validator_rejects_missing_or_copied_translations():
    entry = _entry()
    entry["short"]["zh"] = entry["short"]["en"]
    del entry["question"]["zh"]
    entry["follow_ups"][0]["answer"]["zh"] = "Transfers between HBM and SRAM, translated later."
    problems = "\n".join(interview.validate(_bank_with(entry)))
    assert "short: the zh text is the en text" in problems
    assert "question: expected a mapping with exactly the keys ('en', 'zh')" in problems
    assert "follow_ups[0].answer: the zh text has no Chinese characters" in problems


def test_validator_rejects_references_that_do_not_resolve():
    entry = _entry()
    entry["evidence"] += [
        {"notebook": "notebooks/09_beyond_fa2.ipynb", "cell_tag": "no-such-tag"},
        {"results": "benchmarks/results/no-such-file.json", "key": "rows[0].ms"},
        {"compute": "no_such_function"},
        {"paper": "Somebody et al.", "section": ""},
        {"compute": "tiled_is_exact", "args": {"n": 8, "d": 4, "block_q": 0, "block_k": 4}},
    ]
    problems = "\n".join(interview.validate(_bank_with(entry)))
    assert "has 0 code cells tagged 'no-such-tag'" in problems
    assert "results file benchmarks/results/no-such-file.json does not exist" in problems
    assert "no compute function 'no_such_function'" in problems
    assert "needs a section" in problems
    assert "evidence 7: block_q must be a positive int, got 0" in problems


def test_validator_rejects_a_failing_check(monkeypatch):
    monkeypatch.setitem(evidence.COMPUTE, "tiled_is_exact", lambda **kwargs: 0.0)  # as if the tiled forward broke
    problems = interview.validate(_bank_with(_entry("myth-approximate")))
    assert problems and all("the check tiled_is_exact failed" in p for p in problems), problems


def test_notebook_evidence_must_compute_the_number_it_quotes(tmp_path):
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("print(2 + 2)", metadata={"tags": ["shows-ratio"]}),
        nbformat.v4.new_code_cell("evidence.io_traffic_ratio(n=64, d=8, sram=512)", metadata={"tags": ["ratio"]}),
    ])
    (tmp_path / "notebooks").mkdir()
    nbformat.write(notebook, tmp_path / "notebooks" / "toy.ipynb")
    args = {"n": 64, "d": 8, "sram": 512}
    expected = evidence.io_traffic_ratio(**args)
    good = {"notebook": "notebooks/toy.ipynb", "cell_tag": "ratio", "compute": "io_traffic_ratio", "args": args}
    assert bank_module.evidence_value(good, root=tmp_path) == expected
    with pytest.raises(evidence.EvidenceError, match="does not call io_traffic_ratio"):
        bank_module.evidence_value({**good, "cell_tag": "shows-ratio"}, root=tmp_path)


def test_results_evidence_resolves_keys_in_a_result_file(tmp_path):
    rows = [{"provider": "copy", "bandwidth_tbs": 4.27},
            {"provider": "flashcourse", "kv_len": 32768, "bandwidth_tbs": 2.9},
            {"provider": "flashcourse", "kv_len": 131072, "bandwidth_tbs": 3.61}]
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    path = tmp_path / "benchmarks" / "results" / "run.json"
    path.write_text(json.dumps({"meta": {"device": "GPU"}, "rows": rows}))
    item = {"results": "benchmarks/results/run.json", "key": "rows[provider=flashcourse,kv_len=131072].bandwidth_tbs"}
    assert bank_module.evidence_value(item, root=tmp_path) == 3.61
    assert evidence.results_value("benchmarks/results/run.json", "rows[0].bandwidth_tbs", root=tmp_path) == 4.27
    with pytest.raises(evidence.EvidenceError, match="matches 2 elements"):
        evidence.results_value("benchmarks/results/run.json", "rows[provider=flashcourse].kv_len", root=tmp_path)
    with pytest.raises(evidence.EvidenceError, match="no field 'speed'"):
        evidence.results_value("benchmarks/results/run.json", "rows[1].speed", root=tmp_path)


@pytest.mark.parametrize(("passage", "numbers"), [
    ("up to 740 TFLOP/s (75%), 1.5-2.0x faster", ["740", "75", "1.5", "2.0"]),
    ("2-4x higher throughput, 50-73% of peak", ["2", "4", "50", "73"]),
    ("FA2 on an H100 in FP8, sm_90, O(N^2), 64K tokens, 4 warps, 2 passes", []),
    ("`B_c = ceil(M / 4d)` and $N = 4096$, as in lesson 04 and section 3.1", []),
    ("第 02 课，第 3.1 节，定理 2，快 3 倍，约 11.1", ["3", "11.1"]),
    ("Dao et al. 2022 (arXiv 2205.14135) reports 7.6x", ["7.6"]),
])
def test_numbers_in_finds_claims_and_skips_names(passage, numbers):
    assert interview.numbers_in(passage) == numbers


@pytest.mark.parametrize(("quote", "value", "ok"), [
    ("5.5", 5.4737, True), ("5.5", 5.44, False), ("21", 21.23, True), ("2.30", 2.304, True),
    ("2.30", 2.31, False), ("0.06", 0.0606, True), ("88", 88.72, False),
])
def test_quote_matches_at_the_precision_written(quote, value, ok):
    assert evidence.quote_matches(quote, value) is ok


# ------------------------------------------------------------------------------------------- rendering
@pytest.mark.parametrize("lang", interview.LANGUAGES)
def test_render_markdown_has_every_entry_and_its_parts(lang):
    text = interview.render_markdown(BANK, lang)
    for entry in BANK.entries:
        assert entry["question"][lang] in text
        assert entry["short"][lang] in text
        for follow in entry["follow_ups"]:
            assert follow["question"][lang] in text
    for title in BANK.sections.values():
        assert f"## {title[lang]}" in text
    assert ("证据" in text) is (lang == "zh") and ("Evidence" in text) is (lang == "en")


def test_markdown_to_html_escapes_and_formats():
    html = markdown_to_html("Use `a < b` and **bold** *here*.\n\n- one\n- two")
    assert html == ("<p>Use <code>a &lt; b</code> and <strong>bold</strong> <em>here</em>.</p>"
                    "<ul><li>one</li><li>two</li></ul>")


# ------------------------------------------------------------------------------------------- the quiz
def _visible(quiz: Quiz) -> str:
    return quiz.question_view.value + quiz.answer_view.value + quiz.follow_up_view.value


def test_quiz_hides_the_answer_until_asked_and_walks_the_follow_ups():
    quiz = Quiz(BANK, seed=3)
    assert quiz.reveal_button.disabled and all(b.disabled for b in quiz.score_buttons.values())
    quiz.next_button.click()
    entry = quiz.current
    assert 'class="fc-quiz-question"' in quiz.question_view.value
    assert markdown_to_html(entry["question"]["en"]) in quiz.question_view.value
    assert "fc-quiz-answer" not in _visible(quiz) and entry["short"]["en"][:40] not in _visible(quiz)
    assert quiz.follow_up_button.disabled and all(b.disabled for b in quiz.score_buttons.values())

    quiz.reveal_button.click()
    assert 'class="fc-quiz-answer"' in quiz.answer_view.value
    assert markdown_to_html(entry["short"]["en"]) in quiz.answer_view.value
    assert not quiz.score_buttons["got_it"].disabled

    for index, follow in enumerate(entry["follow_ups"]):
        assert not quiz.follow_up_button.disabled
        quiz.follow_up_button.click()
        assert quiz.follow_up_index == index and not quiz.revealed
        assert markdown_to_html(follow["question"]["en"]) in quiz.follow_up_view.value
        assert markdown_to_html(follow["answer"]["en"]) not in quiz.follow_up_view.value
        quiz.reveal_button.click()
        assert markdown_to_html(follow["answer"]["en"]) in quiz.follow_up_view.value
    assert quiz.follow_up_button.disabled and quiz.next_follow_up() is None


def test_quiz_self_score_counts_once_per_question():
    quiz = Quiz(BANK, seed=0)
    quiz.next_button.click()
    quiz.reveal_button.click()
    quiz.score_buttons["partly"].click()
    quiz.score_buttons["got_it"].click()  # disabled after the first score: no effect
    assert quiz.total == 0.5 and 'class="fc-quiz-score"' in quiz.score_view.value
    assert "0.5 / 1" in quiz.score_view.value
    quiz.next_button.click()
    quiz.reveal_button.click()
    quiz.score_buttons["got_it"].click()
    assert quiz.total == 1.5 and len(quiz.scores) == 2


def test_quiz_round_asks_every_question_once():
    quiz = Quiz(BANK, seed=7, section="myths")
    asked = [quiz.next_question()["id"] for _ in range(len(quiz.entries))]
    assert sorted(asked) == sorted(e["id"] for e in BANK.in_section("myths"))
    assert asked != [e["id"] for e in BANK.in_section("myths")]  # shuffled (seeded, so deterministic)


def test_quiz_starts_every_learner_on_common_basic_questions():
    """Whatever the seed, a round opens with the common, basic questions, and never with an advanced one."""
    from flashcourse.interview.quiz import ease

    basics = {e["id"] for e in BANK.with_tags("freq:common", "level:basic")}
    assert len(basics) >= 5
    for seed in (0, 1, 2, None):
        quiz = Quiz(BANK, seed=seed)
        asked = [quiz.next_question() for _ in range(len(BANK.entries))]
        assert {e["id"] for e in asked[:len(basics)]} == basics
        assert [ease(e) for e in asked] == sorted(ease(e) for e in asked)
    first = {Quiz(BANK, seed=seed).next_question()["id"] for seed in range(6)}
    assert len(first) > 1, "the order within a step is shuffled"


def test_quiz_shows_the_short_answer_first_and_folds_the_long_one():
    quiz = Quiz(BANK, seed=0)
    quiz.next_button.click()
    quiz.reveal_button.click()
    shown = quiz.answer_view.value
    short_at = shown.index(markdown_to_html(quiz.current["short"]["en"]))
    fold = shown.index('<details class="fc-quiz-long">')
    assert short_at < fold < shown.index(markdown_to_html(quiz.current["long"]["en"]))
    assert '<details class="fc-quiz-long" open' not in shown
    if quiz.current.get("points"):
        assert short_at < shown.index('class="fc-quiz-points"') < fold


def test_quiz_in_chinese_shows_chinese():
    quiz = Quiz(BANK, lang="zh", seed=1)
    assert quiz.next_button.description == "新问题"
    quiz.next_button.click()
    quiz.reveal_button.click()
    assert markdown_to_html(quiz.current["short"]["zh"]) in quiz.answer_view.value
    assert "30 秒回答" in quiz.answer_view.value
    assert "fc-quiz" in quiz.widget._dom_classes


def test_quiz_names_a_myth_typed_in_the_answer_box_and_shows_the_wrong_answers():
    quiz = Quiz(BANK, lang="zh", seed=0)
    entry = quiz.next_question()
    quiz.answer_box.value = "SRAM 约 20MB，所以整块 tile 都放得下"
    quiz.reveal()
    shown = quiz.answer_view.value
    assert 'class="fc-quiz-myth"' in shown and "20 MB 的 SRAM" in shown  # named, with its correction
    assert 'class="fc-quiz-wrong"' in shown
    assert all(markdown_to_html(w["claim"]["zh"]) in shown for w in entry["wrong_answers"])
    quiz.next_question()
    assert quiz.answer_box.value == ""  # a new question starts with an empty box
    quiz.reveal()
    assert 'class="fc-quiz-myth"' not in quiz.answer_view.value


def test_quiz_rejects_bad_arguments():
    with pytest.raises(ValueError, match="lang must be one of"):
        Quiz(BANK, lang="fr")
    with pytest.raises(KeyError, match="no section 'nope'"):
        Quiz(BANK, section="nope")
    with pytest.raises(ValueError, match="kind must be one of"):
        Quiz(BANK).score("perfect")


# ------------------------------------------------------------------------------------------- lesson 10's HTML
@pytest.mark.parametrize("lang", interview.LANGUAGES)
def test_lesson_html_hides_answers_shows_evidence_after_them_and_wrong_answers_beside_corrections(lang):
    entry = BANK.entry("myth-io-linear")
    page = interview.render_entry_html(entry, lang)
    hidden = page[page.index('<details class="fc-answer">'):page.index("</details>")]
    assert markdown_to_html(entry["short"][lang]) in hidden and markdown_to_html(entry["long"][lang]) in hidden
    assert hidden.index(markdown_to_html(entry["long"][lang])) < hidden.index('class="fc-evidence"')
    assert entry["question"][lang] in page[:page.index("<details")]  # the question is shown, its answer is not
    for follow in entry["follow_ups"]:
        answer = markdown_to_html(follow["answer"][lang])
        assert f"</summary>{answer}</details>" in page  # each follow-up's answer hidden too
    table = page[page.index('<table class="fc-wrong">'):]
    left = ' style="text-align: left; vertical-align: top"'  # headers aligned with the prose below
    assert table.count(f"<th{left}>") == 2 and "<th>" not in table
    for wrong in entry["wrong_answers"]:
        assert (f"<tr><td{left}>{markdown_to_html(wrong['claim'][lang])}</td>"
                f"<td{left}>{markdown_to_html(wrong['correction'][lang])}</td></tr>") in table
    section = interview.render_html(BANK, lang, section="myths")
    assert section.count('<div class="fc-entry"') == len(BANK.in_section("myths"))


@pytest.mark.parametrize("lang", interview.LANGUAGES)
def test_lesson_10_renders_every_section_with_hidden_answers_and_links_exercises_12_and_14(lang):
    name = "10_interview_walkthrough.ipynb" if lang == "en" else "10_interview_walkthrough_zh.ipynb"
    lesson = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    code = "\n".join(cell.source for cell in lesson.cells if cell.cell_type == "code")
    for section in BANK.sections:
        assert f'interview.render_html(bank, "{lang}", section="{section}")' in code, section
    prose = "\n".join(c.source for c in lesson.cells)
    assert "../exercises/ex12_from_memory.ipynb" in prose
    assert "../exercises/ex14_interview_code.ipynb" in prose  # the hand-written code round (手撕代码)


# ------------------------------------------------------------------------------------------- tags
@pytest.mark.parametrize("entry", BANK.entries, ids=lambda e: e["id"])
def test_every_entry_is_tagged_with_one_frequency_and_one_level(entry):
    tags = bank_module.tags_of(entry)
    assert sum(t.startswith("freq:") for t in tags) == 1 and sum(t.startswith("level:") for t in tags) == 1, tags
    assert set(tags) <= set(bank_module.TAGS), tags


def test_validator_rejects_tags_outside_the_vocabulary():
    entry = _entry()
    entry["tags"] = ["freq:common", "freq:rare", "level:expert"]
    problems = "\n".join(interview.validate(_bank_with(entry)))
    assert "unknown tag 'level:expert'" in problems
    assert "has 2 freq: tags" in problems and "has 0 level: tags" in problems
    entry["tags"] = "freq:common"
    assert "tags must be a list" in "\n".join(interview.validate(_bank_with(entry)))
    del entry["tags"]  # tags are optional in the schema
    assert interview.validate(_bank_with(entry)) == []


def test_with_tags_filters_the_bank():
    common = BANK.with_tags("freq:common")
    assert common and all("freq:common" in e["tags"] for e in common)
    both = BANK.with_tags("freq:common", "level:advanced")
    assert set(e["id"] for e in both) <= set(e["id"] for e in common)
    with pytest.raises(KeyError, match="unknown tags"):
        BANK.with_tags("freq:sometimes")


# ------------------------------------------------------------------------------ saying it: length, polarity, terms
def _spoken_length(text: str) -> int:
    """Syllables said: one per Chinese character or digit, an English word's vowel groups ("attention" 3,
    "kernel" 2), one per letter of an acronym (HBM 3). Counting letters would make "attention" (said in three
    syllables) nine times as long as a character."""
    count = len(re.findall(r"[\u4e00-\u9fff]", text)) + len(re.findall(r"\d", text))
    for word in re.findall(r"[A-Za-z]+", text):
        count += len(word) if word.isupper() else max(1, len(re.findall(r"[aeiouy]+", word.lower())))
    return count


def test_spoken_length_counts_syllables():
    assert _spoken_length("标准 attention 的 kernel") == 3 + 3 + 2
    assert _spoken_length("HBM 读 4.4 GB") == 3 + 1 + 2 + 2


def test_short_answers_can_be_said_in_30_seconds():
    """Chinese 30-second answers: at most 90 syllables at the median, none over 130 (about 30 s at four to five
    syllables a second); the English ones at most 90 words. The course's own measurements belong in the longer
    answer."""
    lengths = {e["id"]: _spoken_length(e["short"]["zh"]) for e in BANK.entries}
    assert statistics.median(lengths.values()) <= 90, sorted(lengths.items(), key=lambda kv: -kv[1])[:10]
    assert {k: n for k, n in lengths.items() if n > 130} == {}
    words = {e["id"]: len(e["short"]["en"].split()) for e in BANK.entries}
    assert {k: n for k, n in words.items() if n > 90} == {}


def test_short_answers_do_not_talk_about_the_course():
    """An interviewer does not know the course: no "the course", "our", 本课程, 我们 in a 30-second answer."""
    found = [e["id"] for e in BANK.entries
             if re.search(r"\b(the course|course's|our|we)\b", e["short"]["en"], re.I)
             or re.search(r"本课程|我们", e["short"]["zh"])]
    assert found == []


def _answers(entry):
    yield "short", entry["short"]
    for i, follow in enumerate(entry["follow_ups"]):
        yield f"follow_ups[{i}]", follow["answer"]


def test_english_and_chinese_answers_agree_in_polarity():
    """A follow-up answered "No." in English is not answered 不同 / 是 in Chinese: an English answer that opens with
    yes or no has a Chinese one that opens the same way, and where both open with a verdict (yes, no, different,
    the same), the verdicts agree."""
    found = []
    for entry in BANK.entries:
        for where, answer in _answers(entry):
            en, zh = zh_style.polarity(answer["en"], "en"), zh_style.polarity(answer["zh"], "zh")
            if (en in ("yes", "no") and zh != en) or (en and zh and en != zh):
                found.append(f"{entry['id']} {where}: en opens with {en}, zh with {zh}: {answer['zh'][:30]}")
    assert found == []


@pytest.mark.parametrize(("text", "lang", "kind"), [
    ("No. The same exact attention", "en", "no"), ("Not always: thread blocks", "en", "no"),
    ("Yes: the rule is built for sampling", "en", "yes"), ("Different: FA4 reschedules", "en", "different"),
    ("Equal up to rounding", "en", None), ("不同。仍是同样的精确注意力", "zh", "different"),
    ("不是，数学相同", "zh", "no"), ("没有。前向做同样的矩阵乘", "zh", "no"), ("都不是。", "zh", "no"),
    ("是的：拒绝采样规则", "zh", "yes"), ("可以：状态每个 token 更新一次", "zh", "yes"), ("相同的思路", "zh", "same"),
    ("在浮点舍入误差范围内相等", "zh", None),
])
def test_polarity_reads_how_an_answer_opens(text, lang, kind):
    assert zh_style.polarity(text, lang) == kind


def test_the_polarity_check_catches_the_fa4_mismatch():
    entry = _entry("fa4-blackwell")
    follow = next(f for f in entry["follow_ups"] if "FA2" in f["question"]["en"])
    follow["answer"]["zh"] = "不同。" + follow["answer"]["zh"]
    en, zh = zh_style.polarity(follow["answer"]["en"], "en"), zh_style.polarity(follow["answer"]["zh"], "zh")
    assert (en, zh) == ("no", "different")


def _glossary_chosen_terms() -> str:
    """The glossary's "Chinese, as we write it" column (the "avoid" column lists the other renderings on purpose)."""
    rows = [line.split("|") for line in (ROOT / "docs" / "glossary.md").read_text().splitlines()
            if line.startswith("|") and not line.startswith("|---")]
    return "\n".join(row[2] for row in rows[1:] if len(row) > 3)


def test_one_term_per_concept_in_the_bank_lesson_glossary_and_generated_docs():
    """Each concept has one Chinese name (prefill, decode, prompt, KV cache, thread block, key, head, rescale,
    block table, tile, ...), in the bank, lesson 10 (zh, markdown and code), the glossary's chosen terms and
    docs/interview_zh.md."""
    def term_problems(text, where):
        return [p for p in zh_style.problems(text, where) if "the course writes" in p]

    found = [p for entry in BANK.entries for where, field in _texts(entry)
             for p in term_problems(field["zh"], f"{entry['id']} {where}")]
    lesson = nbformat.read(ROOT / "notebooks" / "10_interview_walkthrough_zh.ipynb", as_version=4)
    for index, cell in enumerate(lesson.cells):
        found += term_problems(cell.source, f"lesson 10 (zh) cell {index}")
    found += term_problems(_glossary_chosen_terms(), "glossary")
    found += term_problems((ROOT / "docs" / "interview_zh.md").read_text(), "docs/interview_zh.md")
    assert found == []


def test_the_native_phrasing_rules():
    """访存瓶颈 rather than 受限于访存, "A vs B" between numbers, one full-width colon per sentence; 线程块 is allowed
    (NVIDIA's Chinese documentation uses it), and 对 in its ordinary senses is not flagged."""
    found = "\n".join(zh_style.problems("标准注意力受限于访存。decode 是计算受限的。"))
    assert found.count("translated rhythm") == 2
    assert "write “A vs B”" in "\n".join(zh_style.problems("FLOPs 是 75.2 对 66.6 GFLOPs，读写 4.4 GB 对 40.3 GB。"))
    assert "two full-width colons" in "\n".join(zh_style.problems("限制来自：共享内存（经典错误：溢出）。"))
    fine = ("标准 attention 是访存瓶颈。FLOPs 是 75.2 vs 66.6 GFLOPs。每个线程块对应一个 SM，GQA 对 decode 有影响，"
            "KIVI 对 K 按 channel 量化。结论：先数字节。再看 stall：long scoreboard 说明在等显存？")
    assert zh_style.problems(fine) == []


def test_a_field_of_the_bank_has_at_most_one_full_width_colon():
    """Colons in separate sentences pass problems() but not field_problems(); colons inside code do not count."""
    two = "decode 是带宽瓶颈：每步读整个 cache。prefill 是计算瓶颈：几千个 token 乘同一个权重。"
    assert zh_style.problems(two) == []
    assert "2 full-width colons in one field" in "\n".join(zh_style.field_problems(two, "x"))
    assert zh_style.field_problems("合并规则：`lse = log(exp(a)：exp(b))`，每行一个数。") == []
    assert zh_style.field_problems("decode 是带宽瓶颈，每步读整个 cache：字节决定时间。") == []


def test_the_term_check_catches_each_second_rendering():
    bad = "预填充时读 KV 缓存，提示词很长，解码时每个 block 看 8 个 KV 头，键和查询，重新缩放，查块表，Q 块"
    text = "\n".join(zh_style.problems(bad))
    for term in ("预填充", "KV 缓存", "提示词", "解码", "KV 头", "“键”", "查询", "重新缩放", "块表", "Q 块"):
        assert term in text, term
    assert zh_style.problems("投机解码和贪心解码是固定说法；关键在于 prefill 和 decode。") == []
    assert "no space between Chinese and a Latin word" in "\n".join(zh_style.problems("K、V tile依次流过"))
    bad = "标准注意力加因果掩码，在线 softmax 的当前最大值变大就重缩放，反向重算 P"
    text = "\n".join(zh_style.problems(bad))
    for term in ("“注意力”", "“掩码”", "“在线 softmax”", "“当前最大值”", "“重缩放”", "“重算”"):
        assert term in text, term
    said = "标准 attention 加 causal mask，online softmax 的 running max 变大就 rescale，反向重计算 P"
    assert zh_style.problems(said) == []


def test_answers_are_said_by_the_engineer_who_built_it():
    """No 本课程 in any answer of the bank (an engineer says 我写的 kernel), 正是 at most five times in all."""
    texts = [(f"{entry['id']} {where}", field["zh"]) for entry in BANK.entries for where, field in _texts(entry)]
    assert zh_style.answer_problems(texts) == []
    found = "\n".join(zh_style.answer_problems([("a", "本课程的 kernel"), ("b", "正是" * 6)]))
    assert "a: says 本课程" in found and "正是 6 times" in found


def test_glossary_names_every_chosen_term():
    chosen = _glossary_chosen_terms()
    for term in ("prefill", "decode", "prompt", "KV cache", "thread block", "block table", "tile", "rescale", "head",
                 "attention", "mask", "online softmax", "running max", "重计算"):
        assert term in chosen, term
