"""Shell completion scripts (bash, zsh, fish) generated from the CLI's own argparse
parser, so they list exactly its commands, options and choices (no dependency).

Completion is static: commands, options and the choices argparse knows; file names where
an option takes a free value. Job ids and budget names would need the server.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field


@dataclass
class Node:
    """One command level: `path` is "" for the top, "budget set" for a subcommand."""

    path: str
    help: str = ""
    options: list[str] = field(default_factory=list)
    value_options: list[str] = field(default_factory=list)  # options followed by a value
    choices: dict[str, list[str]] = field(default_factory=dict)  # option -> its values
    option_help: dict[str, str] = field(default_factory=dict)
    words: list[str] = field(default_factory=list)  # values of a positional with choices
    children: dict[str, Node] = field(default_factory=dict)


def command_tree(parser: argparse.ArgumentParser, path: str = "", text: str = "") -> Node:
    node = Node(path, text)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: (a.help or "").replace("%%", "%") for a in action._choices_actions}
            for name, sub in action.choices.items():
                child_path = f"{path} {name}".strip()
                node.children[name] = command_tree(sub, child_path, helps.get(name, ""))
        elif action.option_strings:
            if isinstance(action, argparse._HelpAction):
                continue
            node.options += action.option_strings
            for option in action.option_strings:
                node.option_help[option] = (action.help or "").replace("%%", "%")
                if action.nargs != 0:
                    node.value_options.append(option)
                    if action.choices:
                        node.choices[option] = [str(c) for c in action.choices]
        elif action.choices:
            node.words += [str(c) for c in action.choices]
    return node


def _walk(node: Node):
    yield node
    for child in node.children.values():
        yield from _walk(child)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def bash(parser: argparse.ArgumentParser) -> str:
    """For bash (4 or later: associative arrays), and for zsh through its bashcompinit."""
    prog = parser.prog
    fn = "_" + prog.replace("-", "_")
    words, values, children, choices = [], [], [], []
    for node in _walk(command_tree(parser)):
        # Keys start with the program's name: bash has no empty associative-array key.
        path = f"{prog} {node.path}".strip()
        key = _quote(path)
        words.append(f"[{key}]={_quote(' '.join([*node.children, *node.words, *node.options]))}")
        values.append(f"[{key}]={_quote(' '.join(node.value_options))}")
        children.append(f"[{key}]={_quote(' '.join(node.children))}")
        for option, allowed in node.choices.items():
            choices.append(f"[{_quote(path + '|' + option)}]={_quote(' '.join(allowed))}")
    table = "\n".join(
        f"typeset -gA {fn}_{name}=(\n    " + "\n    ".join(rows) + "\n)"
        for name, rows in (
            ("words", words), ("values", values), ("children", children), ("choices", choices),
        )
    )  # fmt: skip
    return f"""# {prog} completion for bash. Load it with
#   eval "$({prog} completion bash)"      (e.g. in ~/.bashrc)
{table}
{fn}() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} path={prog} word i skip=0
    for ((i = 1; i < COMP_CWORD; i++)); do
        word=${{COMP_WORDS[i]}}
        if ((skip)); then skip=0; continue; fi
        if [[ $word == -- ]]; then COMPREPLY=(); return; fi
        if [[ $word == -* ]]; then
            [[ " ${{{fn}_values[$path]}} " == *" $word "* ]] && skip=1
        elif [[ " ${{{fn}_children[$path]}} " == *" $word "* ]]; then
            path="$path $word"
        fi
    done
    if ((skip)); then
        # An option's value: its choices, else (complete -o default) file names.
        local allowed=${{{fn}_choices[$path|${{COMP_WORDS[COMP_CWORD-1]}}]}}
        COMPREPLY=()
        [[ -n $allowed ]] && COMPREPLY=($(compgen -W "$allowed" -- "$cur"))
        return
    fi
    COMPREPLY=($(compgen -W "${{{fn}_words[$path]}}" -- "$cur"))
}}
complete -o default -F {fn} {prog}
"""


def zsh(parser: argparse.ArgumentParser) -> str:
    prog = parser.prog
    return f"""# {prog} completion for zsh (the bash script through bashcompinit). Load it with
#   eval "$({prog} completion zsh)"      (e.g. in ~/.zshrc, after compinit)
autoload -U +X compinit && {{ (( $+functions[compdef] )) || compinit }}
autoload -U +X bashcompinit && bashcompinit
{bash(parser)}"""


def fish(parser: argparse.ArgumentParser) -> str:
    prog = parser.prog
    tree = command_tree(parser)
    lines = [
        f"# {prog} completion for fish. Load it with",
        f"#   {prog} completion fish > ~/.config/fish/completions/{prog}.fish",
        f"complete -c {prog} -e",
        f"complete -c {prog} -f",  # no file names unless an option takes a value
    ]
    for node in _walk(tree):
        names = node.path.split()
        if not names:
            at = "__fish_use_subcommand"
        else:
            # At this level: its words were given, and none of its subcommands yet.
            seen = " && ".join(f"__fish_seen_subcommand_from {n}" for n in names)
            below = " ".join(node.children)
            at = seen + (f" && not __fish_seen_subcommand_from {below}" if below else "")
        condition = f"-n {_quote(at)}"
        for name, child in node.children.items():
            lines.append(f"complete -c {prog} {condition} -a {name} -d {_quote(child.help)}")
        if node.words:
            lines.append(f"complete -c {prog} {condition} -a {_quote(' '.join(node.words))}")
        for option in node.options:
            flag = f"-l {option[2:]}" if option.startswith("--") else f"-s {option[1:]}"
            spec = ""
            if option in node.choices:
                spec = f" -x -a {_quote(' '.join(node.choices[option]))}"
            elif option in node.value_options:
                spec = " -r -F"  # a free value: file names are offered
            help_text = node.option_help.get(option, "")
            described = f" -d {_quote(help_text)}" if help_text else ""
            lines.append(f"complete -c {prog} {condition} {flag}{spec}{described}")
    return "\n".join(lines) + "\n"


SHELLS = {"bash": bash, "zsh": zsh, "fish": fish}
