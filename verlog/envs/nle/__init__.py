"""MiniHack and NetHack (the NetHack Learning Environment) played as text.

:mod:`.env` holds the games; what the model reads comes from one of two renderers:
:mod:`.verlog_text` (verlog's own text, ``protocol="verlog"``) or :mod:`.balrog_text` (the text of
BALROG's NLE language wrapper, ``protocol="balrog"``). :mod:`.agents` holds the scripted players.
"""
