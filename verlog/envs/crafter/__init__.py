"""Crafter, the 2D survival game, played as text: :mod:`.env` (verlog's text and the scripted
players), :mod:`.balrog_text` (the text BALROG's evaluation shows)."""
