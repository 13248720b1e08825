"""`vit-demo` / `python scripts/demo.py`: a local web page for a trained model. Drop images on it and see the
top classes, and where the model looks (attention rollout) over the image, with its controls.

The page is served by Gradio (the `demo` extra: pip install 'vit-lightning[demo]'), on 127.0.0.1 unless
--host says otherwise; it fetches nothing from elsewhere. A file that cannot be read gets its message on the
page, the other images are still shown.

Exit status: 0 when the server is stopped (Ctrl-C), 2 an unusable checkpoint or arguments, or no Gradio.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from vit.exits import MissingExtra
from vit.failures import exit_on_failure
from vit.data.images import find_images
from vit.inference.classifier import add_checkpoint_argument, load_classifier
from vit.models.rollout import HEAD_FUSIONS


def parse_args(argv):
    p = argparse.ArgumentParser(prog="vit-demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_argument(p)
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to serve on; 0.0.0.0 lets every machine that reaches this one use the model "
                        "(no login)")
    p.add_argument("--examples", type=Path, default=None, help="a folder of example images to offer on the page")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    return p.parse_args(argv)


def build_page(clf, checkpoint: str, examples: list[Path]):
    """The Gradio page: inputs, controls, and one HTML block of results (vit.inference.demo.render)."""
    import gradio as gr

    from vit.inference.demo import MAX_IMAGES, PREDICTED, analyse, model_card, render

    def show(files, head_fusion, discard_ratio, method, label):
        paths = [f if isinstance(f, str) else f.name for f in files or []]
        results = [analyse(clf, path, head_fusion, discard_ratio, method, label) for path in paths[:MAX_IMAGES]]
        return render(results, left_out=max(0, len(paths) - MAX_IMAGES))

    with gr.Blocks(title="vit-demo") as page:
        gr.Markdown(model_card(clf, checkpoint))
        with gr.Row():
            with gr.Column(scale=1):
                files = gr.File(label="Images", file_count="multiple", type="filepath", elem_id="vit-files")
                head_fusion = gr.Radio(list(HEAD_FUSIONS), value="mean", label="Head fusion", elem_id="vit-fusion")
                discard = gr.Slider(0.0, 0.95, value=0.0, step=0.05, label="Discard ratio", elem_id="vit-discard")
                method = gr.Radio(["rollout", "gradient"], value="rollout", label="Method", elem_id="vit-method")
                label = gr.Dropdown([PREDICTED, *clf.class_names], value=PREDICTED,
                                    label="Class to explain (gradient)", elem_id="vit-label")
                if examples:
                    gr.Examples([[[str(p)]] for p in examples], inputs=[files], label="Examples")
            with gr.Column(scale=2):
                out = gr.HTML(elem_id="vit-results")
        controls = [files, head_fusion, discard, method, label]
        for control in controls:
            control.change(show, inputs=controls, outputs=out)
    return page


@exit_on_failure
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # offline: no telemetry calls
    try:
        import gradio as gr
    except ImportError:
        raise MissingExtra("vit-demo needs Gradio: make install EXTRAS=demo (or pip install 'vit-lightning[demo]')") \
            from None
    clf = load_classifier(args.checkpoint).to(args.device)
    examples = find_images([args.examples]) if args.examples else []
    page = build_page(clf, args.checkpoint, examples)
    system_fonts = gr.themes.Default(font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])
    print(f"vit-demo: serving {args.checkpoint} on http://{args.host}:{args.port} (Ctrl-C stops it)", flush=True)
    page.queue(default_concurrency_limit=1).launch(server_name=args.host, server_port=args.port, theme=system_fonts,
                                                   max_file_size="50mb", show_error=True, quiet=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
