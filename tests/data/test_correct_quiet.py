"""--quiet: the keep-correct predictions run with the progress bar disabled."""
from keyheads.data.correct import predict_next
from keyheads.testing import tiny_model


def test_predictions_without_a_progress_bar_equal_those_with_one():
    model = tiny_model("llama")
    prompts = ["1 + 2 = ", "3 + 4 = ", "12 + 5 = "]
    answers = [model.tokenizer("3")["input_ids"][-1]] * 3
    quiet = predict_next(model, prompts, 2, "checking", answers, progress=False)
    loud = predict_next(model, prompts, 2, "checking", answers, progress=True)
    assert quiet == loud and len(quiet) == 3
