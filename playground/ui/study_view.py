"""The Study tab: open a ``playground study`` database, see its aggregate per lane and drill down.

A study file is an ordinary session store (``playground/study.py``). The view opens one from
the server's data directory (the folder of the page's own session database) or from an
upload, shows :func:`playground.study.aggregate` as a table and its plotly figures, and opens
any prompt's comparison in the Compare tab through the page's own ``open_session`` — the
Sessions view's route. Only stored traces are read, so it needs no model.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import gradio as gr
from gradio.utils import get_upload_folder

from playground.core.errors import PlaygroundError
from playground.ownership import one_user
from playground.store import Store, default_path, default_store
from playground.study import METRICS, aggregate, figures, study_sessions
from playground.ui.compare import ComparePage
from playground.ui.html import status_html


HEADERS = ["Lane", "Decoder", "tok/fwd", "wall s", "forwards", "ppl", "dist-1", "dist-2", "agree", "finish"]
FIGURE_CHOICES = [("tokens per target forward", "tokens_per_target_forward"), ("wall time", "wall_s"),
                  ("target forwards", "target_forwards"), ("perplexity", "perplexity"),
                  ("distinct-1", "distinct_1"), ("distinct-2", "distinct_2"), ("agreement", "agreement"),
                  ("finish reasons", "finish_reasons")]
SQLITE_MAGIC = b"SQLite format 3\x00"
NO_STUDY = '<div class="lane-info">no study open</div>'
COPY_TTL_S = 3600.0  # a study's private copy outlives a reader's browsing of it


# ---------------------------------------------------------------------- files
def data_dir() -> Path:
    """The folder study files may be opened from: where the page's session database lives."""
    return Path(default_path()).expanduser().resolve().parent


def resolve_study_path(text: str | None) -> Path:
    """The study file ``text`` names, inside :func:`data_dir` (relative names are taken from
    there; an empty name means the page's own database). Refuses anything outside it."""
    raw = (text or "").strip()
    base = data_dir()
    p = Path(default_path()).expanduser() if not raw else Path(raw).expanduser()
    p = (p if p.is_absolute() else base / p).resolve()  # resolve(): a symlink cannot lead out
    if p != base and base not in p.parents:
        raise PlaygroundError(f"study files are opened from {base} only; upload the .db file instead")
    return p


def check_study_file(path: str | os.PathLike[str]) -> None:
    """Refuse, in one line, a path that is not an existing session database — before the
    store opens it, since opening creates the tables in any other file."""
    p = Path(path)
    name = p.name or str(p)
    if not p.exists():
        raise PlaygroundError(f"no study at {name}")
    if not p.is_file():
        raise PlaygroundError(f"{name} is not a file")
    try:
        with open(p, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as e:
        raise PlaygroundError(f"cannot read {name}: {e.strerror or e}") from None
    if head != SQLITE_MAGIC:
        raise PlaygroundError(f"{name} is not a study database (not an SQLite file)")
    try:
        conn = sqlite3.connect(p.resolve().as_uri() + "?mode=ro", uri=True)
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            conn.close()
    except sqlite3.Error as e:
        raise PlaygroundError(f"{name} is not a study database ({e})") from None
    if not {"sessions", "runs"} <= tables:
        raise PlaygroundError(f"{name} is not a study database (it holds no stored comparisons)")


def read_only_copy(path: str | os.PathLike[str], folder: str | os.PathLike[str] | None = None) -> Path:
    """A private copy of the SQLite file at ``path``, made with SQLite's online backup from a
    read-only connection: the original is never written (opening a store migrates its schema,
    which must never happen to a file the instance did not make for itself, or to an upload).
    Copies are named by the original's content and kept for :data:`COPY_TTL_S`."""
    src_path = Path(path)
    check_study_file(src_path)
    digest = hashlib.sha256()
    with open(src_path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    base = Path(folder) if folder is not None else Path(tempfile.gettempdir()) / "playground-studies"
    base.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for old in base.glob("*.db"):
        try:
            if now - old.stat().st_mtime > COPY_TTL_S:
                old.unlink()
        except OSError:
            continue
    out = base / f"{digest.hexdigest()[:32]}.db"
    if not out.exists():
        tmp = out.with_suffix(".part")
        try:
            src = sqlite3.connect(src_path.resolve().as_uri() + "?mode=ro", uri=True)
            try:
                dst = sqlite3.connect(str(tmp))
                try:
                    src.backup(dst)
                finally:
                    dst.close()
            finally:
                src.close()
        except sqlite3.Error as e:
            tmp.unlink(missing_ok=True)
            raise PlaygroundError(f"{src_path.name} cannot be read as a study ({e})") from None
        os.replace(tmp, out)
    os.utime(out)
    return out


def load_study(path: str | os.PathLike[str], only_studies: bool = False) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The aggregate of the study at ``path`` and its sessions (prompt order); an empty store
    or one without study comparisons is one line. ``path`` is opened as it is (pass a
    :func:`read_only_copy`); ``only_studies`` refuses a database holding any session that is
    not part of a study (someone's page sessions)."""
    check_study_file(path)
    with Store(path) as store:
        sessions = study_sessions(store)
        total = store.count()
    name = Path(path).name
    if not sessions:
        raise PlaygroundError(f"{name} holds no study comparisons (run `playground study --out {name}` first)")
    if only_studies and total != len(sessions):
        raise PlaygroundError(f"{name} is not a study file (it holds other sessions too)")
    return aggregate(sessions), sessions


def uploaded_path(file: Any) -> Path:
    """The path of a file this page uploaded: inside Gradio's upload folder, else refused
    (a direct call naming any other server path opens nothing)."""
    raw = getattr(file, "name", file)
    if not isinstance(raw, str) or not raw:
        raise PlaygroundError("no file received")
    p = Path(raw).resolve()
    folder = Path(get_upload_folder()).resolve()
    if folder not in p.parents:
        raise PlaygroundError("that is not a file uploaded to this page")
    return p


# ---------------------------------------------------------------------- what the view shows
def aggregate_rows(agg: dict[str, Any]) -> list[list[Any]]:
    """The aggregate as table rows: lane, decoder, the metrics (rounded as the CLI table
    prints them; "-" where there is no value) and the finish reasons."""
    rows = []
    for lane in agg["lanes"]:
        cells: list[Any] = [lane["lane"], str(lane["decoder"])]
        for key, _title, digits in METRICS:
            v = lane.get(key)
            cells.append("-" if v is None else round(float(v), digits))
        cells.append(", ".join(f"{k} {v}" for k, v in lane["finish_reasons"].items()))
        rows.append(cells)
    return rows


def prompt_choices(sessions: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """One dropdown entry per prompt: its id and the prompt's first line, valued by the id."""
    out = []
    for s in sessions:
        key = str(s["settings"]["study"]["key"])
        first = next((ln.strip() for ln in s["prompt"].splitlines() if ln.strip()), "")
        out.append((f"{key}: {first[:70]}", key))
    return out


def summary_line(agg: dict[str, Any], name: str) -> str:
    """One line about the study: file, prompts, lanes, model and scorer."""
    return (f"{name}: {agg['prompts']} prompt{'s' if agg['prompts'] != 1 else ''} · {len(agg['lanes'])} lanes · "
            f"model {agg.get('model')} · perplexity under {agg.get('scorer') or '(no scores)'}")


def copy_to_page_store(session: dict[str, Any], source: str) -> str:
    """The id of ``session`` in the page's own store, copied there once (found again by its
    study fingerprint and prompt id), so its share link and branches work like any session's.

    The copy keeps the study settings under ``from_study``, not ``study``: the page's store
    never looks like (part of) a study itself.
    """
    store = default_store()
    info = dict(session["settings"]["study"])
    mark = {"key": info.get("key"), "fingerprint": info.get("fingerprint"), "file": Path(source).name}
    for row in store.list_sessions():
        if row["title"] != session["title"]:
            continue
        have = (store.load_session(row["id"]).get("settings") or {}).get("from_study") or {}
        if have.get("key") == mark["key"] and have.get("fingerprint") == mark["fingerprint"]:
            return row["id"]
    settings = {k: v for k, v in session["settings"].items() if k != "study"}
    settings["from_study"] = mark
    return store.save_session(session["title"], session["model"], session["prompt"], settings, session["runs"])


class StudyView:
    """Builds the Study tab and opens a prompt's comparison in the Compare tab."""

    def __init__(self, page: ComparePage, tabs: Any) -> None:
        self.page, self.tabs = page, tabs

    def build(self) -> None:
        """Create the components (call inside the Study tab)."""
        gr.Markdown("Open a study written by `playground study --out study.db`: the aggregate per lane over "
                    "every prompt, its figures, and any prompt's comparison in the Compare tab. Files are "
                    f"read from the server's data folder (`{data_dir()}`; empty = the page's own database) "
                    "or uploaded.", elem_classes=["lane-info"])
        with gr.Row(equal_height=True):
            self.path = gr.Textbox(label="Study file on the server", placeholder="study.db", max_lines=1,
                                   elem_id="study-path", scale=3)
            self.open_btn = gr.Button("Open", variant="primary", elem_id="study-open", scale=1)
            self.upload = gr.UploadButton("⇪ Upload .db…", file_types=[".db"], type="filepath",
                                          elem_id="study-upload", size="md", scale=1)
        self.status = gr.HTML(NO_STUDY, elem_id="study-status")
        self.table = gr.Dataframe(value=[], headers=HEADERS, interactive=False, wrap=True,
                                  elem_id="study-table", max_height=360)
        with gr.Row(equal_height=True):
            self.figure_choice = gr.Dropdown(FIGURE_CHOICES, value=FIGURE_CHOICES[0][1], label="Figure",
                                             elem_id="study-figure-choice", scale=1)
            self.prompt = gr.Dropdown([], value=None, label="Prompt", elem_id="study-prompt", scale=3)
            self.open_compare = gr.Button("Open in Compare", elem_id="study-open-compare", scale=1)
        self.figure = gr.Plot(elem_id="study-figure", show_label=False)
        # {"path": the study file, "sessions": prompt id -> session id in that file, "aggregate": shown}
        self.study = gr.State(None)

    def wire(self, demo: gr.Blocks) -> None:
        """Attach the events, hidden from the public API."""
        shown = [self.study, self.status, self.table, self.prompt, self.figure]
        self.open_btn.click(self.on_open, [self.path, self.figure_choice], shown)
        self.path.submit(self.on_open, [self.path, self.figure_choice], shown)
        self.upload.upload(self.on_upload, [self.upload, self.figure_choice], shown)
        self.figure_choice.change(self.on_figure, [self.study, self.figure_choice], [self.figure])
        self.open_compare.click(self.on_open_prompt, [self.study, self.prompt],
                                self.page.page_outputs() + [self.tabs, self.status])

    # ---------------------------------------------------------------- handlers
    def on_open(self, text: Any, figure: str | None = None) -> list[Any]:
        """Open the study file named in the path box (inside the data folder), from a read-only
        copy. On a hosted instance only study files open (not the page's own database, nor any
        other session store)."""
        try:
            if text is not None and not isinstance(text, str):
                raise PlaygroundError("the study file must be a file name")
            path = resolve_study_path(text)
            if not one_user() and not (text or "").strip():
                raise PlaygroundError("name a study file (the page's own database is not one)")
            copy = read_only_copy(path)
        except PlaygroundError as e:
            return self._refuse(str(e))
        return self._show(str(copy), path, figure, only_studies=not one_user())

    def on_upload(self, file: Any, figure: str | None = None) -> list[Any]:
        """Open an uploaded study file, from a read-only copy (the upload is never migrated)."""
        try:
            path = uploaded_path(file)
            copy = read_only_copy(path)
        except PlaygroundError as e:
            return self._refuse(str(e))
        return self._show(str(copy), path, figure)

    def on_figure(self, study: dict[str, Any] | None, figure: str | None) -> Any:
        """Draw another figure of the open study."""
        if not study or not study.get("aggregate"):
            return gr.skip()
        return self._figure(study["aggregate"], figure)

    def on_open_prompt(self, study: dict[str, Any] | None, key: str | None) -> dict[Any, Any]:
        """Open the chosen prompt's comparison in the Compare tab (replayed, no model)."""
        if not study:
            return self._warn("open a study first")
        sid = (study.get("sessions") or {}).get(str(key)) if key is not None else None
        if not sid:
            return self._warn("pick a prompt of the study first")
        try:
            check_study_file(study["path"])
            with Store(study["path"]) as store:
                session = store.load_session(sid)
            source = str(study.get("source") or study["path"])
            same = Path(source).resolve() == Path(default_path()).expanduser().resolve()
            page_sid = sid if same else copy_to_page_store(session, source)
        except PlaygroundError as e:
            return self._warn(str(e))
        up = self.page.open_session(page_sid)
        up[self.tabs] = gr.Tabs(selected="compare")
        up[self.status] = status_html(f"Opened prompt {key} in the Compare tab.", "ok")
        return up

    # ---------------------------------------------------------------- helpers
    def _show(self, path: str, source: Path, figure: str | None, only_studies: bool = False) -> list[Any]:
        """Show the study read from ``path`` (a private copy of ``source``)."""
        name = source.name
        try:
            agg, sessions = load_study(path, only_studies=only_studies)
        except PlaygroundError as e:
            return self._refuse(str(e))
        state = {"path": path, "source": str(source), "sessions": {str(k): v for k, v in agg["sessions"].items()}, "aggregate": agg}
        choices = prompt_choices(sessions)
        return [state, status_html(summary_line(agg, name), "ok"), aggregate_rows(agg),
                gr.Dropdown(choices=choices, value=choices[0][1] if choices else None),
                self._figure(agg, figure)]

    @staticmethod
    def _figure(agg: dict[str, Any], figure: str | None) -> Any:
        figs = figures(agg)
        return figs.get(figure or "", figs[FIGURE_CHOICES[0][1]])

    def _refuse(self, msg: str) -> list[Any]:
        gr.Warning(msg)
        return [None, status_html(msg, "error"), [], gr.Dropdown(choices=[], value=None), None]

    def _warn(self, msg: str) -> dict[Any, Any]:
        gr.Warning(msg)
        return {self.status: status_html(msg, "error")}
