"""How the Chinese text of the bank and of lesson 10 is written: the terms Chinese engineers keep in English,
one term per concept, the punctuation they use, and the phrasing they use where a translation reads stiff
(访存瓶颈 rather than 受限于访存, "A vs B" rather than "A 对 B" between numbers, one full-width colon per
sentence at most). ``problems(text)`` lists every breach; ``answer_problems`` the rules over the bank's answers
(no 本课程, 正是 at most five times); tests run it on the
bank, the zh lesson, the glossary's chosen terms and docs/interview_zh.md. ``field_problems(text)`` adds the rule
for one field of the bank (a question, an answer, a point): at most one full-width colon, since a passage said
aloud that stops at a colon every sentence reads as a translation. ``polarity(answer, lang)`` reads
whether an answer opens with yes, no, "different" or "the same", so that a test can check that the English and
the Chinese answers of a follow-up agree.

The glossary that goes with it, for people, is ``docs/glossary.md`` (English -> Chinese, with the renderings to
avoid and why).
"""

from __future__ import annotations

import re

__all__ = ["AVOID", "MOST_ZHENGSHI", "TERMS", "answer_problems", "field_problems", "polarity", "problems"]

# A rendering that reads wrong to the engineers who ask these questions -> what they write instead.
AVOID = {
    "内核": "kernel (内核 reads as an operating-system kernel)",
    "线程束": "warp / warpgroup / warp specialization",
    "张量核心": "Tensor Core",
    "词元": "token",
    "程序实例": "thread block (or CTA) for a Triton program",
    "查询块": "Q 块",
    "键块": "KV 块",
    "批 x 头": "batch x head",
    "屋顶线": "Roofline 模型",
    "拐点": "脊点 (the Roofline model's ridge point)",
    "当前和": "指数和 l",
}
# One term per concept: a second rendering of a concept the bank already names -> the one it uses. Patterns are
# regular expressions; where a Chinese word is also part of a set phrase (投机解码, 关键), the phrase is let through.
TERMS = [
    (r"预填充", "prefill"),
    (r"(?<!投机)(?<!贪心)解码", "decode (投机解码 and 贪心解码 stay: they name decoding strategies)"),
    (r"提示词", "prompt (system prompt)"),
    (r"KV ?缓存|分页缓存", "KV cache (分页 KV cache)"),
    (r"(?<!关)键(?!盘)", "key (a query's key; 键 reads as a dictionary key)"),
    (r"(?:KV |query |个|的|按|注意力)头|头维度", "head, KV head, head dim"),
    (r"重新缩放|重缩放", "rescale"),
    (r"注意力", "attention (因果 attention, 稀疏 attention)"),
    (r"掩码", "mask (causal mask, block mask)"),
    (r"在线 ?softmax", "online softmax"),
    (r"当前最大值|运行最大值", "running max"),
    (r"重算", "重计算"),
    (r"块表|页表", "block table"),
    (r"查询", "query"),
    (r"批大小|批处理|批量处理", "batch size, batching"),
    (r"Q 块|KV 块|K/V 块|分数块|对角块|满块", "Q tile, KV tile, 分数 tile, 对角 tile, full tile"),
    (r"分块预填充", "chunked prefill"),
    (r"环形 ?attention", "ring attention"),
    (r"非相干处理", "incoherent processing"),
    (r"生产者|消费者", "producer, consumer (warp specialization's roles)"),
    (r"基准测试", "benchmark"),
    # in a Chinese sentence; the English titles of cited papers and docs keep their words
    (r"(?<=[\u4e00-\u9fff] )prefix cach(?:ing|e)|prefix cach(?:ing|e)(?= ?[\u4e00-\u9fff])", "前缀缓存"),
]
_FULL_WIDTH = "，。：；！？、（）“”"
_RULES = [
    (re.compile(rf"[{_FULL_WIDTH}] +"), "a space after full-width punctuation"),
    (re.compile(rf" +[{_FULL_WIDTH}]"), "a space before full-width punctuation"),
    (re.compile(r"少\s*[\d.]+\s*倍"), "“少 X 倍”: say what is compared, “A 是 B 的 X 倍”"),
    (re.compile(r"倍\s*[（(][\d.\-–]+\s*[x×][）)]"), "a multiple written twice, “X 倍（Xx）”"),
    (re.compile(r"\*\*[^*\n]*[\u4e00-\u9fff][^*\n]*[.:]\*\*"), "a half-width colon or full stop closing a bold "
                                                            "heading: use “：”"),
    (re.compile(r'"[^"\n]*[\u4e00-\u9fff][^"\n]*"'), "ASCII quotation marks around Chinese: use “ ”"),
    (re.compile(r"[A-Za-z0-9][\u4e00-\u9fff]|[\u4e00-\u9fff][A-Za-z0-9]"), "no space between Chinese and a Latin word "
                                                                        "or a number"),
    (re.compile(r"受限于(?:访存|带宽|计算)|(?:访存|带宽|计算)受限"),
     "“受限于访存 / 计算受限” is translated rhythm: write 访存瓶颈, 带宽瓶颈, 计算瓶颈 (or memory-bound)"),
    (re.compile(r"\d[\d.]*(?:\s*[A-Za-zµ/]+)?\s*对\s*\d"), "two numbers compared with “对”: write “A vs B”"),
    (re.compile(r"[^。？！\n]*：[^。？！\n]*："), "two full-width colons in one sentence: keep one, make the other a "
                                               "comma or a new sentence"),
]
# Run-in headings ("<strong>30 秒回答：</strong>", "**追问：**") and the labels of a wrong answer and its
# correction in the rendered bank end in a colon of their own: not part of a sentence.
_RUN_IN = re.compile(r"<strong>[^<\n]*</strong>|\*\*[^*\n]*\*\*|(?:错误说法|纠正)：")


def _without_code(text: str) -> str:
    """The text with `code spans`, fenced code and $math$ blanked out: the rules do not apply inside them."""
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    return re.sub(r"`[^`\n]*`|\$[^$\n]*\$", "C", text)


def problems(text: str, where: str = "text") -> list[str]:
    """Every breach of the house style in a Chinese passage: a rendering to avoid, or a punctuation rule."""
    found = []
    prose = _without_code(text)
    for term, instead in AVOID.items():
        if term in prose:
            found.append(f"{where}: writes “{term}”; write {instead}")
    for pattern, instead in TERMS:
        for match in re.finditer(pattern, prose):
            context = prose[max(0, match.start() - 8):match.end() + 8]
            found.append(f"{where}: writes “{match[0]}” (…{context}…); the course writes {instead}")
    for match in re.finditer(r"\*\*([^\n]+?)\*\*", prose):  # pairs of ** from the left, as Markdown does
        followed_by_text = match.end() < len(prose) and prose[match.end()].isalnum()
        if match[1][-1] in "，。：；！？、）”" and followed_by_text:
            found.append(f"{where}: “**{match[1]}**” followed by text does not render in CommonMark: write "
                         f"<strong>{match[1]}</strong>")
    for pattern, rule in _RULES:
        for match in pattern.finditer(_RUN_IN.sub("", prose) if "colons" in rule else prose):
            start = max(0, match.start() - 12)
            found.append(f"{where}: {rule}: …{prose[start:match.end() + 12]}…")
    return found


def field_problems(text: str, where: str = "text") -> list[str]:
    """``problems(text)`` plus the bank's rule for one field: at most one full-width colon outside code, kept for
    what introduces a list or a formula; elsewhere a native engineer writes a comma, a full stop or a clause."""
    found = problems(text, where)
    colons = _without_code(text).count("：")
    if colons > 1:
        found.append(f"{where}: {colons} full-width colons in one field: keep at most one (for a list or a "
                     "formula), write the others as a comma or a new sentence")
    return found


# 正是 ("precisely") is a written intensifier; said aloud every few answers it sounds rehearsed.
MOST_ZHENGSHI = 5


def answer_problems(texts: list[tuple[str, str]]) -> list[str]:
    """The rules for the answers of the whole bank, given as ``(where, Chinese text)`` pairs: no 本课程 (an answer
    is said by the engineer who built it: 我写的 kernel, 我测得), and 正是 at most :data:`MOST_ZHENGSHI` times."""
    found = [f"{where}: says 本课程; an engineer says 我 (我写的 kernel, 我在 H200 上测得)"
             for where, text in texts if "本课程" in text]
    count = sum(text.count("正是") for _, text in texts)
    if count > MOST_ZHENGSHI:
        found.append(f"正是 {count} times in the answers: at most {MOST_ZHENGSHI} (write 就是, or drop it)")
    return found


# How an answer opens, per language: the first pattern that matches its start decides. "Different" before "no",
# since 不同 starts with 不.
_OPENINGS = {
    "en": [("different", r"(different|they differ)\b"), ("same", r"(the same|same)\b"),
           ("no", r"(no|not|never|none|neither|false)\b"), ("yes", r"(yes|true)\b")],
    "zh": [("different", r"(不同|不一样|有区别)"), ("same", r"(相同|一样|一致)"),
           ("no", r"(都不|不|没|否|并不|并非|错|无)"), ("yes", r"(是|对|可以|能|会|有)")],
}


def polarity(answer: str, lang: str) -> str | None:
    """"yes", "no", "different" or "same" when ``answer`` opens with one (English "No.", "Not always", "Yes:";
    Chinese 不是、没有、可以、是的、不同), else None. Leading Markdown emphasis and quotes are skipped."""
    text = answer.strip().lstrip("*_\"“”'` ").lower()
    for kind, pattern in _OPENINGS[lang]:
        if re.match(pattern, text):
            return kind
    return None
