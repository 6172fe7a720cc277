"""The runtime: :class:`~.engine.Engine` (a loaded model, its tokenizer and one context) with
generation (:mod:`.generation`), tokenizer, chat templates, sampling, streaming, parallel slots
over one engine with a prefix cache (:mod:`.slots`), and the default model's download
(:mod:`.default_model`)."""
