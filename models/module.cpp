// being written (issue 3)
