"""The documentation site (mkdocs.yml, docs/) and the README front page: the site builds strictly,
so a broken link or anchor, or a page left out of the nav, fails the suite; the configuration
page's table is what llog/config.py generates; the README stays a front page whose links land."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pymdownx.slugs import slugify

from llog.config import with_settings_table

CHECKOUT = Path(__file__).resolve().parents[2]
DOCS = CHECKOUT / "docs"
README = CHECKOUT / "README.md"

#: GitHub's heading ids, as mkdocs.yml's toc slugify makes them.
_slug = slugify(case="lower")


def mkdocs_build(root: Path, site: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` of the site at ``root`` (its mkdocs.yml) into ``site``."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=root,
                          env=env, capture_output=True, text=True, timeout=300)


def test_site_builds_strictly(tmp_path):
    done = mkdocs_build(CHECKOUT, tmp_path / "site")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "configuration" / "index.html").is_file()


@pytest.fixture()
def site_copy(tmp_path) -> Path:
    """A copy of mkdocs.yml and docs/ to plant faults in."""
    shutil.copy(CHECKOUT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(DOCS, tmp_path / "docs")
    return tmp_path


@pytest.mark.parametrize("fault,page,text,message", [
    ("a link to a page that does not exist", "operations.md", "[gone](no-such-page.md)",
     "contains a link 'no-such-page.md', but the target is not found"),
    ("a link to a heading that does not exist", "operations.md", "[gone](kafka.md#no-such-heading)",
     "does not contain an anchor '#no-such-heading'"),
    ("a link out of docs/", "operations.md", "[conf](../conf/README.md)",
     "contains a link '../conf/README.md', but the target is not found"),
    ("a page that is not in the nav", "orphan.md", "# An orphan\n",
     "not included in the \"nav\" configuration"),
])
def test_strict_build_fails_on(site_copy, fault, page, text, message):
    path = site_copy / "docs" / page
    path.write_text((path.read_text() + "\n" if path.exists() else "") + text + "\n")
    done = mkdocs_build(site_copy, site_copy / "site")
    assert done.returncode != 0, f"{fault}: the strict build passed"
    assert message in done.stderr, done.stderr


def test_strict_build_fails_on_a_nav_entry_without_its_page(site_copy):
    (site_copy / "docs" / "benchmarks.md").unlink()
    done = mkdocs_build(site_copy, site_copy / "site")
    assert done.returncode != 0
    assert "benchmarks.md" in done.stderr, done.stderr


def test_configuration_page_table_is_generated_from_config():
    """Fails when llog/config.py changed and the page was not generated again:
    ``python -m llog.config docs-table --write docs/configuration.md``."""
    page = (DOCS / "configuration.md").read_text()
    assert page == with_settings_table(page)


def test_configuration_page_command(tmp_path):
    page = tmp_path / "configuration.md"
    stale = (DOCS / "configuration.md").read_text().replace("| `LLOG_S3_BUCKET` | unset |", "| `LLOG_S3_BUCKIT` | unset |")
    assert stale != (DOCS / "configuration.md").read_text()
    page.write_text(stale)
    done = subprocess.run([sys.executable, "-m", "llog.config", "docs-table", "--write", str(page)], cwd=CHECKOUT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert page.read_text() == (DOCS / "configuration.md").read_text()


# --- the README front page --------------------------------------------------------------------------


def test_readme_starts_with_the_two_commands():
    lines = README.read_text().splitlines()
    fence = lines.index("```sh")
    assert [line.split("#")[0].strip() for line in lines[fence + 1:fence + 3]] == ["make demo", "make test"]
    assert lines[fence + 3] == "```"
    assert all(not line.strip() or line.startswith("# ") for line in lines[:fence]), "only the title before them"


def test_readme_is_a_front_page():
    assert len(README.read_text().splitlines()) <= 150


def headings(page: Path) -> set[str]:
    """The ids of ``page``'s headings, as GitHub and the site give them."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(re.sub(r"[`*]", "", m.group(1)).strip(), "-") for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def test_readme_links_land():
    """Every relative link of the README names a file of the checkout, and a heading of it
    when it names one (the README is outside the site, so mkdocs does not check it)."""
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert local
    for link in local:
        path, _, anchor = link.partition("#")
        assert (CHECKOUT / path).exists(), f"README links to {path}, which does not exist"
        if anchor:
            assert anchor in headings(CHECKOUT / path), f"README links to {link}: {path} has no such heading"


def test_readme_examples_are_getting_starteds():
    """The README's first write, read and curl are the getting-started page's, word for word."""
    page = (DOCS / "getting-started.md").read_text()
    for block in re.findall(r"```(?:python|sh)\n.*?```", README.read_text(), flags=re.S)[1:]:
        assert block in page, f"not in docs/getting-started.md:\n{block}"
