"""How the Chinese text of the bank and of lesson 10 is written: the terms Chinese engineers keep in English,
and the punctuation they use. ``problems(text)`` lists every breach; tests run it on the bank and the zh lesson.

The glossary that goes with it, for people, is ``docs/glossary.md`` (English -> Chinese, with the renderings to
avoid and why).
"""

from __future__ import annotations

import re

__all__ = ["AVOID", "problems"]

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
_FULL_WIDTH = "，。：；！？、（）“”"
_RULES = [
    (re.compile(rf"[{_FULL_WIDTH}] +"), "a space after full-width punctuation"),
    (re.compile(rf" +[{_FULL_WIDTH}]"), "a space before full-width punctuation"),
    (re.compile(r"少\s*[\d.]+\s*倍"), "“少 X 倍”: say what is compared, “A 是 B 的 X 倍”"),
    (re.compile(r"倍\s*[（(][\d.\-–]+\s*[x×][）)]"), "a multiple written twice, “X 倍（Xx）”"),
    (re.compile(r"\*\*[^*\n]*[\u4e00-\u9fff][^*\n]*[.:]\*\*"), "a half-width colon or full stop closing a bold "
                                                            "heading: use “：”"),
    (re.compile(r'"[^"\n]*[\u4e00-\u9fff][^"\n]*"'), "ASCII quotation marks around Chinese: use “ ”"),
]


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
    for match in re.finditer(r"\*\*([^\n]+?)\*\*", prose):  # pairs of ** from the left, as Markdown does
        followed_by_text = match.end() < len(prose) and prose[match.end()].isalnum()
        if match[1][-1] in "，。：；！？、）”" and followed_by_text:
            found.append(f"{where}: “**{match[1]}**” followed by text does not render in CommonMark: write "
                         f"<strong>{match[1]}</strong>")
    for pattern, rule in _RULES:
        for match in pattern.finditer(prose):
            start = max(0, match.start() - 12)
            found.append(f"{where}: {rule}: …{prose[start:match.end() + 12]}…")
    return found
