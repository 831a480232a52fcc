"""The bottom layer: conventions and file writing that every other layer shares. It imports nothing
of the package and no torch (:mod:`probes.core.chat`: chat-model conventions; :mod:`probes.core.files`:
atomic file writers; :mod:`probes.core.text`: hidden code points written visibly, for every view)."""
