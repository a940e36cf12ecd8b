"""TextWorld's generated text adventures: :mod:`.env` (the game), :mod:`.games` (game files built
offline and cached), :mod:`.generator` (verlog's faster, equivalent constraint check)."""
