"""Models as str -> str policies: in memory, from a learner's checkpoint, through a pipeline."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer, GPT2LMHeadModel, pipeline

from agents.llm.sampling import SamplingConfig
from agents.llm.text import pipeline_policy, text_policy
from agents.training.restore import checkpoint_policy
from agents.training.train import Trainer
from cory_env.demo import evaluate
from examples.exercises.common import course_config, course_lm

PROMPTS = ["colour of snow ?", "colour of sky ? hint : red", "colour of ash ? hint : a the"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = course_lm(str(tmp_path_factory.mktemp("course-lm")))
    trainer = Trainer(course_config("cory", folder, iterations=2))
    for _ in trainer.run():
        pass
    path = str(tmp_path_factory.mktemp("ckpt") / "cory.pt")
    trainer.save(path)
    return folder, trainer, path


def test_a_checkpoint_answers_as_the_trained_policy(trained):
    _, trainer, path = trained
    tok = trainer.env.tokenizer
    for agent in ("llm_0", "llm_1"):
        live = text_policy(trainer.learner.policies[agent], tok, max_new_tokens=2)
        saved = checkpoint_policy(path, agent=agent)
        assert saved.max_new_tokens == 2  # the run's answer length
        assert [saved(p) for p in PROMPTS] == [live(p) for p in PROMPTS]
    with pytest.raises(ValueError, match="no agent 'llm_7'"):
        checkpoint_policy(path, agent="llm_7")


def test_greedy_answers_equal_a_transformers_pipelines(trained):
    folder, _, _ = trained
    model, tok = GPT2LMHeadModel.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    pipe = pipeline("text-generation", model=model, tokenizer=tok, device="cpu")
    from agents.llm.policy import LLMPolicy

    ours = text_policy(LLMPolicy.from_pretrained(folder), folder, max_new_tokens=3)
    theirs = pipeline_policy(pipe, max_new_tokens=3, pad_token_id=tok.eos_token_id)
    assert [ours(p).strip() for p in PROMPTS] == [theirs(p).strip() for p in PROMPTS]


def test_sampled_answers_are_seeded_and_capped(trained):
    _, trainer, _ = trained
    policy, tok = trainer.learner.policies["llm_0"], trainer.env.tokenizer
    hot = SamplingConfig(temperature=3.0)
    runs = [[text_policy(policy, tok, 2, hot, seed=s)(p) for p in PROMPTS * 3] for s in (1, 1, 2)]
    assert runs[0] == runs[1] and runs[0] != runs[2]
    assert all(len(tok.encode(a)) <= 2 for a in runs[0])
    with pytest.raises(ValueError, match="max_new_tokens must be a positive integer, got 0"):
        text_policy(policy, tok, 0)


def test_a_trained_model_plays_a_role_of_the_text_env(trained):
    _, trainer, path = trained
    live = text_policy(trainer.learner.policies["llm_1"], trainer.env.tokenizer, 2)
    runs = [evaluate({"pioneer": lambda p: "red", "observer": observer}, episodes=6,
                     task="colours") for observer in (checkpoint_policy(path, "llm_1"), live)]
    assert runs[0] == runs[1]
    assert runs[0]["roles"]["pioneer"] == {"reward": 1.0}
    answers = [e["observer"]["answer"] for e in runs[0]["episodes"]]
    assert runs[0]["roles"]["observer"]["copy_rate"] == sum(a == "red" for a in answers) / 6
