"""GSM8K-style counterfactuals: the phrase asking for the calculation is replaced."""
from keyheads.data.wordproblems import question_pair
from keyheads.testing.tiny import char_tokenizer

PAPER = (
    "On a 16 GB (gigabyte) capacity USB drive, 50% is already busy. Calculate the number of gigabytes still available."
)


def test_paper_example():
    ref, cf = question_pair(PAPER)
    assert ref == PAPER
    assert cf == PAPER.replace("Calculate the number", "Describe the location")


def test_last_phrase_is_replaced_and_unknown_questions_give_none():
    q = "Tom has 3 apples. How many pears are there? How much money does Tom have?"
    ref, cf = question_pair(q)
    assert cf == q.replace("How much", "How come")
    assert question_pair("Tom has 3 apples and likes them.") is None
    assert question_pair("Somehow many apples fell.") is None  # only whole words match


def test_with_tokenizer_only_same_length_replacements():
    tok = char_tokenizer()  # one token per character
    q = "Ann buys 4 cakes. How many cakes does she have?"
    ref, cf = question_pair(q, tokenizer=tok)
    assert len(ref) == len(cf) and cf != ref
    # "Describe the location" is one character longer than "Calculate the number": no aligned pair
    assert question_pair(PAPER, tokenizer=tok) is None
