"""Chinese for the checks' diagnoses (exercises 12, 14 and 15, the interview round): a failing check's message
gets a line "中文：..." that says the same in Chinese, so a candidate preparing in Chinese reads the diagnosis in
the language of the interview. The English message is unchanged (the batch grader and the tests read it).

:func:`bilingual` wraps a check function; :func:`chinese` is the translation of one message: every known diagnosis
it contains (the sentences of :mod:`._mistakes`), then what kind of failure it is (a wrong value, a NaN, a shape, a
dtype, an error raised by the learner's code)."""

from __future__ import annotations

import functools

from . import _mistakes as mistakes

__all__ = ["DIAGNOSES", "bilingual", "chinese"]

DIAGNOSES = {
    mistakes.SCALE_FORGOTTEN: "忘了乘 scale：分数 q k^T 要乘 scale（scale 为 None 时是 1/sqrt(D)）。",
    mistakes.SCALE_TWICE: "scale 乘了两次：分数只乘一次 scale。",
    mistakes.MASK_DIAGONAL: ("causal mask 差了一位：连对角线（key j = query i）也遮住了；query 可以看自己，"
                             "只遮 j > i。"),
    mistakes.MASK_ONE_LATE: "causal mask 差了一位：query i 看到了 key i + 1；要遮住所有 j > i 的 key。",
    mistakes.MASK_MISSING: "没有加 causal mask：causal=True 时，把 j > i 的分数设成 -inf。",
    mistakes.MASK_REVERSED: "causal mask 反了：遮住的是过去（j < i），应该遮住未来（j > i）。",
    mistakes.WRONG_AXIS: ("softmax 的轴不对：要对每一行（沿 key，axis=-1）归一化，"
                          "让每行权重之和为 1。"),
    mistakes.NO_MAX: ("没有减最大值：大分数的 exp 溢出成 inf，inf / inf = NaN；"
                      "改算 exp(x - max)，softmax 不变。"),
    mistakes.MASKED_ROW_NAN: ("整行都是 -inf（全部被遮住）时结果应为 0 而不是 NaN："
                              "最大值是 -inf 时改减 0，也不要除以为 0 的和。"),
    mistakes.SUM_NOT_RESCALED: ("指数和没有 rescale：running max 从 m_old 变成 m_new 时，"
                                "先把旧的 l 乘上 exp(m_old - m_new)，再加新块。"),
    mistakes.OUTPUT_NOT_RESCALED: ("输出累加器没有 rescale：running max 变大时，先把累加器乘上 exp(m_old - m_new)，"
                                   "再加 P_ij V_j。"),
    mistakes.NOT_NORMALISED: "输出没有归一化：最后把累加器除以指数和 l，只除一次。",
    mistakes.EMPTY_ROW_NAN: ("某一行没有任何可见的 key（l = 0，0 / 0）而出现 NaN：causal mask 正确时"
                             "每个 query 至少能看到自己（key j = i），所以 mask 很可能差了一位、遮住了对角线。"),
}
# What kind of failure a message reports, by a phrase of the English frame (flashcourse.grading._core).
_KINDS = [
    ("not implemented yet", "还没实现：先把上面的 TODO 填上。"),
    ("differs at index", "结果和 float64 参考实现不一致，位置和数值见上面。"),
    ("has NaN at index", "结果里有 NaN，位置见上面。"),
    ("has shape", "输出的形状不对，见上面。"),
    ("has dtype", "dtype 不对：用输入的 dtype 计算，不要用 astype 之类转换。"),
    ("your function raised", "你的代码抛出了异常，见上面。"),
    ("An infinity usually means", "出现 inf 通常是 exp 溢出（先减去行最大值），或者在不该加 mask 的地方加了 mask。"),
    ("allocated", "一次分配的内存太多：实现生成了完整的 N x N 矩阵，要一次只处理一个 tile。"),
]


def chinese(message: str) -> str:
    """The Chinese of a check's failure message: its known diagnoses, then the kind of failure."""
    lines = [zh for en, zh in DIAGNOSES.items() if en in message]
    lines += [zh for phrase, zh in _KINDS if phrase in message]
    return "".join(dict.fromkeys(lines)) or "检查没有通过，原因见上面的英文说明。"


def bilingual(check):
    """A check function whose failure message ends with its Chinese (the exception's type is kept)."""

    @functools.wraps(check)
    def wrapped(*args, **kwargs):
        __tracebackhide__ = True
        try:
            return check(*args, **kwargs)
        except AssertionError as error:
            if error.args and "中文：" not in str(error.args[0]):
                error.args = (f"{error.args[0]}\n中文：{chinese(str(error.args[0]))}", *error.args[1:])
            raise

    return wrapped
