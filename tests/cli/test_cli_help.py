"""The CLI's help speaks to its users: every option of every sub-command has a help text, written
as plain text (no reStructuredText backticks in a terminal), and `mcfl methods` shows whole titles."""

import argparse

from mcfl import cli


def _options(parser, path):
    """(command path, option, help) for every argument and sub-command below ``parser``."""
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for choice in a._choices_actions:
                yield path, choice.dest, choice.help
            for name, sub in a.choices.items():
                yield from _options(sub, f"{path} {name}")
        elif not isinstance(a, argparse._HelpAction):
            yield path, "/".join(a.option_strings) or a.dest, a.help


def test_every_option_has_a_plain_help_text():
    found = list(_options(cli.build_parser(), "mcfl"))
    assert len(found) > 150                       # every sub-command was built, down to mcfl prepare X
    bad = [f"{p} {o}: {h!r}" for p, o, h in found
           if not (h or "").strip() or h == argparse.SUPPRESS or "`" in h]
    assert not bad, "\n".join(bad)
    assert "`" not in cli.build_parser().format_help()


def test_methods_shows_each_title_up_to_its_full_stop(capsys):
    assert cli.main(["methods"]) == 0
    out = capsys.readouterr().out
    # FeSEM's module docstring breaks its first sentence over two lines: it is shown whole
    text = " ".join(out.split())
    assert "Clients Clustering for Better Personalization\", World Wide Web 2022" in text
    # a full stop inside a citation's parentheses does not end the title
    assert "growth functions Eqs. 1-3) and its ablations NaiveGSP and NaiveGSP+ICG" in text
    assert "`" not in out
