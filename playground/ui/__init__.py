"""The Gradio UI (placeholder until the Compare page lands)."""

from __future__ import annotations

import os

import gradio as gr


def build_app() -> gr.Blocks:
    """Build the Gradio Blocks app."""
    with gr.Blocks(title="Decoder Playground") as demo:
        gr.Markdown("# Decoder Playground")
    return demo


def launch(demo: gr.Blocks) -> None:
    """Launch on $PORT / $GRADIO_SERVER_PORT or 7860."""
    port = int(os.environ.get("PORT") or os.environ.get("GRADIO_SERVER_PORT") or 7860)
    demo.queue().launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"), server_port=port)
