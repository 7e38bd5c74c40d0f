"""`gpugeek completion bash|zsh|fish`: each script, loaded in its real shell (skipped
where that shell is not installed), completes commands, subcommands, options and
choices taken from the CLI's parser."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from gpugeek.cli import main


@pytest.fixture
def script(tmp_path, capsys):
    def write(shell: str):
        assert main(["completion", shell]) == 0
        path = tmp_path / f"gpugeek.{shell}"
        path.write_text(capsys.readouterr().out)
        return path

    return write


def run_shell(shell: str, program: str) -> list[str]:
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    done = subprocess.run([shell, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


# The shell asks with the words typed so far, the last one the word being completed
# (where it is empty, the candidates include at least these).
CASES = [
    (["gpugeek", ""], {"launch", "logs", "budget", "budgets", "completion", "status"}),
    (["gpugeek", "bu"], {"budget", "budgets"}),
    (["gpugeek", "budget", ""], {"set", "delete"}),
    (["gpugeek", "--url", "http://x", "budget", "set", "prod", "--ac"], {"--action"}),
    (
        ["gpugeek", "budget", "set", "prod", "--action", ""],
        {"pause", "warn", "pause_non_critical", "alert_only"},
    ),
    (["gpugeek", "completion", ""], {"bash", "zsh", "fish"}),
    (["gpugeek", "logs", "7", "--f"], {"--follow"}),
]


def _words(words: list[str]) -> str:
    return " ".join("'" + w + "'" for w in words)


def test_bash(script):
    path = script("bash")
    for words, expected in CASES:
        out = run_shell(
            "bash",
            f"""source {path}
            COMP_WORDS=({_words(words)}); COMP_CWORD={len(words) - 1}; _gpugeek
            printf '%s\\n' "${{COMPREPLY[@]}}" """,
        )
        assert set(out) == expected if words[-1] else expected <= set(out), words
    # A free option value: nothing offered (bash then offers file names).
    out = run_shell(
        "bash",
        f"""source {path}
        COMP_WORDS=(gpugeek launch -f ''); COMP_CWORD=3; _gpugeek; echo "${{#COMPREPLY[@]}}" """,
    )
    assert out == ["0"]


def test_zsh(script):
    """zsh runs the bash function through bashcompinit (sh emulation, as its compgen
    calls it); zsh's compadd filters by the typed prefix afterwards, so only the
    candidates are checked here."""
    path = script("zsh")
    for words, expected in CASES:
        out = run_shell(
            "zsh",
            f"""source {path}
            emulate -L sh; setopt kshglob noshglob braceexpand
            COMP_WORDS=({_words(words)}); COMP_CWORD={len(words) - 1}; _gpugeek
            printf '%s\\n' "${{COMPREPLY[@]}}" """,
        )
        assert expected <= set(out), words


def test_fish(script):
    path = script("fish")
    for words, expected in CASES:
        line = " ".join(words)
        out = run_shell("fish", f"source {path}; complete -C '{line}'")
        got = {row.split("\t")[0] for row in out}
        assert got == expected if words[-1] else expected <= got, words
