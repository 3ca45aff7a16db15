"""What is built on runs: the studio (a web page that writes and watches runs), LoRA sweeps
(several runs on one base model) and the generated reference pages (``protocol_doc``,
``upstream``). Above ``launch``, whose runs they start; below the CLI."""
