from . import main

main(prog_name="kestrel-actors")
