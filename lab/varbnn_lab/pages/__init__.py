"""The result pages of the special experiments: one module per special experiment, each turning a saved result into its
Markdown page with the shared helpers of :mod:`varbnn_lab.render` (and summarising the saved records into the
rows that result holds). The experiment modules re-export these names, so ``varbnn_lab.uci.render_uci_markdown``
and the like keep working; ``graves-prune`` and ``soap-bubble``, whose modules are small, still draw their pages in
:mod:`varbnn_lab.graves_prune` and :mod:`varbnn_lab.soap_bubble`."""
