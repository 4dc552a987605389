"""Code that runs inside a rank process. Nothing here imports the supervisor, widgets or plots."""
