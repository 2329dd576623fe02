"""The README and the pages under docs/ point at things that exist: every link, every file and module they
name, every `make` target, `python -m` module and `tfship` subcommand they show; the front page stays one
screen (under 10 KB) and docs/architecture.md cites only modules the code has."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "deploy" / "README.md", *(ROOT / "docs").glob("*.md")])
PACKAGES = ("core", "serving", "pipeline", "signatures", "tflite", "tfjs", "deploy", "bench")
# Paths a run makes (not in a clone): run folders, published models, venvs, build outputs.
GENERATED = re.compile(r"^(runs|models|\.venv[\w-]*|bench/work|tfjs/node/node_modules|\.ci|dist|build)(/|$)"
                       r"|^tfjs/model\.json$|^assets\.extra/")  # the last two: inside a published version folder
PATH_SUFFIXES = (".py", ".toml", ".md", ".sh", ".lock", ".txt", ".yaml", ".json", ".mjs", ".desc", ".proto")


def _page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _spans(text: str) -> list[str]:
    """Inline code spans and the lines of fenced code blocks."""
    blocks = re.findall(r"```[^\n]*\n(.*?)```", text, re.DOTALL)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.DOTALL))
    return inline + [line for block in blocks for line in block.splitlines()]


def _make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w.-]*)\s*:(?!=)", (ROOT / "Makefile").read_text(), re.MULTILINE))


def _module_exists(dotted: str) -> bool:
    parts = dotted.removeprefix("tfship.").split(".")
    base = ROOT.joinpath(*parts)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _tfship_commands() -> set[str]:
    from tfship.pipeline.cli.app import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    return set(sub.choices)


def _repo_path(token: str) -> Path | None:
    """The repository file or folder `token` names (from the root or a package folder), else None."""
    token = token.rstrip("/").split("::")[0]
    for base in (ROOT, *(ROOT / p for p in PACKAGES)):
        if (base / token).exists():
            return base / token
    return None


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_links_point_at_files_that_exist(page: Path):
    text = page.read_text(encoding="utf-8")
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+://|^#|^mailto:", target):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists() and not GENERATED.match(target):
            missing.append(target)
    assert not missing, f"{_page_id(page)} links to missing files: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_commands_shown_exist(page: Path):
    """`make T`, `python -m M`, `tfship SUB` and the console scripts, in code blocks and inline code."""
    targets, commands, problems = _make_targets(), _tfship_commands(), []
    scripts = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
    for span in _spans(page.read_text(encoding="utf-8")):
        for words in re.findall(r"(?:^|[;&|(]\s*|\$\s*)make((?:\s+[^\s#;&|)]+)*)", span):
            for word in words.split():
                if word.startswith("-") or "=" in word or "*" in word or word == ".venv/.tfship-installed":
                    continue
                if word not in targets and not word.startswith("<"):
                    problems.append(f"make {word}")
                break  # the first target; the rest are arguments
        for module in re.findall(r"python3?(?:\.11)? -m ([\w.]+)", span):
            if module.split(".")[0] in ("pip", "venv", "pytest", "onnxslim", "tf2onnx", "http", "grpc_tools",
                                        "tensorflowjs", "json"):
                continue
            if not _module_exists(module):
                problems.append(f"python -m {module}")
        code = span.split("#", 1)[0]  # a shell comment is prose
        for sub in re.findall(r"(?:^|[\s$;&|(])tfship (\w[\w-]*)", code):
            if sub not in commands and not code.lstrip().startswith("docker"):
                problems.append(f"tfship {sub}")
        for script in re.findall(r"^\s*(\w+_model_server)\b", span):
            if script not in scripts:
                problems.append(script)
    assert not problems, f"{_page_id(page)} shows commands that do not exist: {sorted(set(problems))}"


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_files_named_in_code_exist(page: Path):
    """Inline code that names a repository path (`serving/tfs/rest.py`, `configs/digits.toml`) names a real one."""
    missing = []
    for span in re.findall(r"`([^`\n\s]+)`", re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"),
                                                     flags=re.DOTALL)):
        if "<" in span or "*" in span or "{" in span or span.startswith(("/", "../", "http", "-", "~", "$")):
            continue
        looks_like_path = "/" in span and re.fullmatch(r"[\w.\-/]+", span) and (
            span.split("/")[0] in (*PACKAGES, "tests", "configs", "docs", "tfship", "deploy", "bench")
            or span.endswith(PATH_SUFFIXES))
        if looks_like_path and not GENERATED.match(span) and _repo_path(span) is None:
            missing.append(span)
    assert not missing, f"{_page_id(page)} names files that do not exist: {missing}"


def test_architecture_cites_only_modules_that_exist():
    """Dotted names (`serving.dataplane.types`, `core.saved_model.read_signatures`) resolve to a module, or to a
    module and a name it defines."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = []
    for span in re.findall(r"`([^`\n]+)`", text):
        for dotted in re.findall(r"(?<![/\w])((?:tfship\.)?(?:%s)(?:\.\w+)+)" % "|".join(PACKAGES), span):
            parts = dotted.removeprefix("tfship.").split(".")
            for cut in range(len(parts), 0, -1):
                if _module_exists(".".join(parts[:cut])):
                    rest = parts[cut:]
                    if rest:
                        base = ROOT.joinpath(*parts[:cut])
                        source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
                        if not re.search(rf"^\s*(?:def|class|async def)\s+{rest[0]}\b|^{rest[0]}\s*[:=]",
                                         source.read_text(), re.MULTILINE):
                            missing.append(dotted)
                    break
            else:
                missing.append(dotted)
    assert not missing, f"docs/architecture.md cites modules or names the code lacks: {sorted(set(missing))}"


def test_readme_front_page_fits_one_screen_and_shows_the_api_first():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode()) < 10 * 1024, f"README.md is {len(readme.encode())} bytes; move topics to docs/"
    first_block = re.search(r"```(\w*)\n", readme)
    assert first_block and first_block.group(1) == "python", "the front page shows the Python API first"
    assert "tfship.ship(" in readme and "tfship.serve(" in readme and "tfship.Client(" in readme
