"""Lightning callbacks of imgcls: the run report and the checkpoint policy."""
