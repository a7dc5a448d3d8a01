"""Speed: the step as one compiled graph, and the modes pipe chooses when the config leaves them."""
