"""BabyAI (minigrid's grid-world missions) played as text: :mod:`.env` holds the game and its bot."""
