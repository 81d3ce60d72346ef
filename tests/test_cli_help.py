"""Every subcommand's --help as a user reads it: plain words, values that can be typed,
each option its own text, the devices listed."""

from __future__ import annotations

import argparse
import dataclasses
import re

import pytest

from napari_finetune.cli import build_parser
from napari_finetune.config import FinetuneConfig, PredictConfig
from napari_finetune.config_fields import DEVICE_NAMES, field_docs

COMMANDS = ["demo", "train", "predict", "export", "info"]
FIELD_NAMES = {f.name for cls in (FinetuneConfig, PredictConfig) for f in dataclasses.fields(cls)}


def subparser(command: str) -> argparse.ArgumentParser:
    sub = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    return sub.choices[command]


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options that have a help text of their own (not -h)."""
    return [a for a in parser._actions if a.option_strings and a.dest != "help"]


def entry(help_text: str, flag: str) -> str:
    """The lines of ``flag``'s entry in a formatted help (its header and its text)."""
    lines = help_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith(flag + " ")
                 or line.strip() == flag or line.lstrip().startswith(flag + ","))
    end = start + 1
    while end < len(lines) and lines[end].startswith(" " * 10):  # its text's lines
        end += 1
    return " ".join(line.strip() for line in lines[start:end])


@pytest.mark.parametrize("command", COMMANDS)
def test_help_has_no_markup_or_field_names(command):
    text = subparser(command).format_help()
    for markup in ("``", ":class:", ":func:", ":meth:", ":mod:"):
        assert markup not in text, f"{command} --help shows {markup!r}"
    # A field's name (batch_size) where its option (--batch-size) or plain words are meant;
    # the usage's metavars (BATCH_SIZE) are upper case.
    leaked = sorted(name for name in FIELD_NAMES if "_" in name and re.search(
        rf"(?<![\w-]){name}(?![\w-])", text))
    assert not leaked, f"{command} --help names fields {leaked}"


@pytest.mark.parametrize("command", COMMANDS)
def test_help_offers_no_none(command):
    """None cannot be typed: the help says what leaving an option out means instead."""
    parser = subparser(command)
    text = parser.format_help()
    assert not re.search(r"\bNone\b", text), [
        line for line in text.splitlines() if re.search(r"\bNone\b", line)]
    for action in options(parser):
        assert None not in (action.choices or ()), action.option_strings


@pytest.mark.parametrize("command", COMMANDS)
def test_each_option_has_its_own_help(command):
    seen: dict[str, str] = {}
    for action in options(subparser(command)):
        flag = action.option_strings[0]
        text = without_default(action.help)
        assert text, f"{command} {flag} has no help"
        assert text not in seen, f"{command}: {flag} has {seen.get(text)}'s help: {text!r}"
        seen[text] = flag


def without_default(text: str | None) -> str:
    return re.sub(r"\s*\(default: .*\)$", "", text or "")


def test_lora_rank_and_alpha_say_different_things():
    actions = {a.option_strings[0]: without_default(a.help) for a in options(subparser("train"))}
    assert actions["--lora-rank"] != actions["--lora-alpha"]
    assert "rank" in actions["--lora-rank"].lower()
    assert "scal" in actions["--lora-alpha"].lower()


@pytest.mark.parametrize("command", ["demo", "train", "predict", "info"])  # not export
def test_device_lists_its_choices(command):
    parser = subparser(command)
    shown = entry(parser.format_help(), "--device")
    for name in DEVICE_NAMES:
        assert re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", shown), (name, shown)


@pytest.mark.parametrize("command", ["train", "predict", "info"])
def test_device_takes_the_names_listed_and_no_other(command, capsys):
    parser = subparser(command)
    action = parser._option_string_actions["--device"]
    for name in ("auto", "cpu", "cuda", "cuda:1", "mps"):
        assert action.type(name) == name
    for bad in ("gpu", "cpu:0", "cuda:x", "None"):
        with pytest.raises(argparse.ArgumentTypeError, match="use auto, cpu, cuda, cuda:N or mps"):
            action.type(bad)


def test_field_docs_are_plain_words_and_one_per_field():
    docs = field_docs(FinetuneConfig)
    assert set(docs) == {f.name for f in dataclasses.fields(FinetuneConfig)}
    assert "``" not in " ".join(docs.values())
    assert "batch size times accumulation" in docs["accumulation"]
    assert len(set(docs.values())) == len(docs), "two fields share one text"
    flags = field_docs(FinetuneConfig, refer=lambda name: "--" + name.replace("_", "-"))
    assert "--cpu-bf16" in flags["mixed_precision"]
    assert "FinetuneConfig" not in field_docs(PredictConfig)["device"]


def test_field_docs_refuses_an_entry_for_two_fields():
    class Two:
        """Two fields.

        Parameters
        ----------
        low, high : float
            The range.
        """

    with pytest.raises(ValueError, match="low, high in one entry"):
        field_docs(Two)
