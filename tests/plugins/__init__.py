"""Parts registered from outside hpcbench, as a site's plugin modules ($HPCBENCH_PLUGINS) would be."""
