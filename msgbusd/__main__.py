from msgbusd.command import main

main()
