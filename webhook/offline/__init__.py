"""The admission core run on files, no cluster: the golden cases of a policy folder (``gpugate policy test``)."""
