"""The result pages of the special experiments: one module per special experiment, each turning a saved result into its
Markdown page with the shared helpers of :mod:`varbnn.experiments.render` (and summarising the saved records into the
rows that result holds). The experiment modules re-export these names, so ``varbnn.experiments.uci.render_uci_markdown``
and the like keep working; ``graves-prune`` and ``soap-bubble``, whose modules are small, still draw their pages in
:mod:`varbnn.experiments.graves_prune` and :mod:`varbnn.experiments.soap_bubble`."""
