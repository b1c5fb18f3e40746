"""Gradio entry point: ``python app.py`` (Hugging Face Spaces runs this file)."""

from __future__ import annotations

from playground.ui import build_app

demo = build_app()

if __name__ == "__main__":
    from playground.ui import launch

    launch(demo)
